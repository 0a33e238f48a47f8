"""The ``batchfleet`` command line: the one place settings are read from the environment.

Every option that has a ``BATCHFLEET_*`` variable reads it here, through
typer's ``envvar``; everything below receives plain values or a settings object.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from batchfleet import __version__
from batchfleet.cli_bench import bench
from batchfleet.cli_bulk import bulk_app
from batchfleet.cli_dlq import dlq_app
from batchfleet.cli_gateway import gateway_app
from batchfleet.cli_status import status
from batchfleet.cli_webhooks import webhooks_app
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail

app = typer.Typer(
    name="batchfleet",
    help="Asynchronous micro-batching PyTorch inference workers fed by Redis Streams or Kafka.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"batchfleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Asynchronous micro-batching PyTorch inference workers fed by Redis Streams or Kafka."""


@app.command()
def worker(
    broker: BrokerOpt,
    results: ResultsOpt = None,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", metavar="SPEC",
        help="Model to serve, repeatable: demo-mlp, demo-encoder, NAME=module:factory or "
             "NAME=path.pt. Env: BATCHFLEET_MODELS (comma-separated).")] = None,
    device: Annotated[str, typer.Option(envvar="BATCHFLEET_DEVICE",
                                        help="auto, cpu, cuda or cuda:N.")] = "auto",
    max_batch_size: Annotated[int, typer.Option(envvar="BATCHFLEET_MAX_BATCH_SIZE",
                                                help="A batch closes at this size...")] = 64,
    max_wait_ms: Annotated[float, typer.Option(
        envvar="BATCHFLEET_MAX_WAIT_MS",
        help="...or when its oldest request has waited this long.")] = 5.0,
    claim_idle_ms: Annotated[int, typer.Option(
        envvar="BATCHFLEET_CLAIM_IDLE_MS",
        help="Redis: reclaim other consumers' entries idle this long (they crashed).")] = 60_000,
    result_ttl_s: Annotated[int, typer.Option(envvar="BATCHFLEET_RESULT_TTL_S",
                                              help="How long results are kept.")] = 86_400,
    grace_s: Annotated[float, typer.Option(
        envvar="BATCHFLEET_GRACE_S",
        help="On SIGTERM, how long in-flight work may take to finish.")] = 30.0,
    kafka_partitions: Annotated[int, typer.Option(
        envvar="BATCHFLEET_KAFKA_PARTITIONS", help="Partitions of topics this worker creates.")
    ] = 4,
    kafka_session_timeout_ms: Annotated[int, typer.Option(
        envvar="BATCHFLEET_KAFKA_SESSION_TIMEOUT_MS",
        help="Kafka: a dead worker's partitions move after this long.")] = 10_000,
    max_attempts: Annotated[int, typer.Option(
        envvar="BATCHFLEET_MAX_ATTEMPTS",
        help="Attempts per request (1 = no retry) before the DLQ.")] = 3,
    retry_base_s: Annotated[float, typer.Option(
        envvar="BATCHFLEET_RETRY_BASE_S", help="Backoff base (full jitter).")] = 0.5,
    retry_cap_s: Annotated[float, typer.Option(
        envvar="BATCHFLEET_RETRY_CAP_S", help="Backoff cap.")] = 30.0,
    retry: Annotated[list[str] | None, typer.Option(
        "--retry", metavar="MODEL=ATTEMPTS[:BASE[:CAP]]",
        help="Per-model retry policy, repeatable, e.g. demo-encoder=5:0.2:10.")] = None,
    quarantine_after: Annotated[int, typer.Option(
        envvar="BATCHFLEET_QUARANTINE_AFTER",
        help="Quarantine a request to the DLQ after this many deliveries that died.")] = 3,
    compute_timeout_s: Annotated[float | None, typer.Option(
        envvar="BATCHFLEET_COMPUTE_TIMEOUT_S",
        help="A batch running longer fails (and is retried).")] = None,
    breaker_failures: Annotated[int, typer.Option(
        envvar="BATCHFLEET_BREAKER_FAILURES",
        help="Circuit breakers open after this many failures in a row.")] = 5,
    breaker_cooldown_s: Annotated[float, typer.Option(
        envvar="BATCHFLEET_BREAKER_COOLDOWN_S",
        help="Seconds open before a half-open probe.")] = 5.0,
    metrics_port: Annotated[int | None, typer.Option(
        envvar="BATCHFLEET_METRICS_PORT",
        help="Serve /metrics, /healthz and /readyz on this port (off when unset).")] = None,
    namespace: NamespaceOpt = "bf",
    worker_id: Annotated[str | None, typer.Option(
        envvar="BATCHFLEET_WORKER_ID",
        help="Consumer name; default host-pid-random. Keep it stable across restarts to "
             "resume a Redis consumer's pending entries at once.")] = None,
    log_format: Annotated[str, typer.Option(envvar="BATCHFLEET_LOG_FORMAT",
                                            help="auto (console on a TTY), json or console.")
                          ] = "auto",
    log_level: Annotated[str, typer.Option(envvar="BATCHFLEET_LOG_LEVEL")] = "info",
    torch_threads: Annotated[int | None, typer.Option(
        envvar="BATCHFLEET_TORCH_THREADS", min=1,
        help="torch intra-op threads (default: torch's, one per core). Small models run "
             "faster with 1 when the worker shares its cores; see docs/performance.md.")
    ] = None,
) -> None:
    """Run a worker: fetch, micro-batch, compute, write results, ack.

    Examples:

        batchfleet worker --broker redis://localhost:6379/0 --model demo-mlp

        batchfleet worker --broker kafka://kafka:9092 --results redis://redis:6379/0 -m demo-encoder

        batchfleet worker --broker redis://localhost:6379/0 --model fraud=mypkg.models:build
    """
    import os

    # OpenMP reads these once, when torch loads it: set them before anything imports torch.
    # PASSIVE: idle torch threads sleep instead of spinning on cores the event loop needs.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if torch_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(torch_threads)

    from schemas.errors import ConfigError
    from workers import Worker, WorkerSettings
    from workers.logs import configure_logging

    models = list(model or [])
    if not models:
        models = [m.strip() for m in os.environ.get("BATCHFLEET_MODELS", "").split(",")
                  if m.strip()]
    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    try:
        settings = WorkerSettings.from_url(
            broker, results, models=tuple(models or ["demo-mlp"]), device=device,
            max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, claim_idle_ms=claim_idle_ms,
            result_ttl_s=result_ttl_s, grace_s=grace_s, kafka_partitions=kafka_partitions,
            kafka_session_timeout_ms=kafka_session_timeout_ms,
            namespace=namespace, max_attempts=max_attempts, retry_base_s=retry_base_s,
            retry_cap_s=retry_cap_s, retry_overrides=_retry_overrides(retry or []),
            quarantine_after=quarantine_after, compute_timeout_s=compute_timeout_s,
            breaker_failures=breaker_failures, breaker_cooldown_s=breaker_cooldown_s,
            metrics_port=metrics_port,
            **({"worker_id": worker_id} if worker_id else {}))
        Worker(settings).run()
    except ConfigError as exc:
        raise fail(str(exc)) from exc


def _retry_overrides(specs: list[str]) -> tuple[tuple[str, str], ...]:
    from workers.retry import RetryConfig

    out = []
    for spec in specs:
        model, sep, policy = spec.partition("=")
        if not sep:
            raise fail(f"--retry {spec!r}: expected MODEL=ATTEMPTS[:BASE_S[:CAP_S]]")
        try:
            RetryConfig.parse(policy, RetryConfig())
        except ValueError as exc:
            raise fail(str(exc)) from exc
        out.append((model.strip(), policy.strip()))
    return tuple(out)


def _parse_inputs(inputs: str | None, inputs_file: Path | None) -> Any:
    if (inputs is None) == (inputs_file is None):
        raise fail("give exactly one of --inputs JSON or --inputs-file FILE.npy")
    if inputs_file is not None:
        return np.load(inputs_file, allow_pickle=False)
    try:
        return json.loads(inputs)  # type: ignore[arg-type]
    except json.JSONDecodeError as exc:
        raise fail(f"--inputs is not valid JSON: {exc}") from exc


@app.command()
def submit(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name.")],
    broker: BrokerOpt,
    inputs: Annotated[str | None, typer.Option(
        help="Inputs as JSON: a list or {name: list}. Decimals are sent as float32 and "
             "whole numbers as int64, unless --dtype says otherwise.")] = None,
    inputs_file: Annotated[Path | None, typer.Option(help="Inputs as a .npy file.")] = None,
    dtype: Annotated[str | None, typer.Option(
        help="Cast JSON inputs to this dtype, e.g. float32.")] = None,
    results: ResultsOpt = None,
    request_id: Annotated[str | None, typer.Option(help="Your own ID (idempotent).")] = None,
    priority: Annotated[str, typer.Option(help="interactive or bulk.")] = "interactive",
    deadline_s: Annotated[float | None, typer.Option(
        help="Answer 'expired' instead of computing after this many seconds.")] = None,
    wait: Annotated[float | None, typer.Option(
        help="Wait up to this many seconds and print the result.")] = None,
    namespace: NamespaceOpt = "bf",
    as_json: JsonOpt = False,
) -> None:
    """Submit one request and print its ID (or, with --wait, its result).

    Examples:

        batchfleet submit -m demo-mlp --inputs '[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]' --wait 5

        batchfleet submit -m demo-encoder --inputs-file tokens.npy --priority bulk
    """
    from producers import AsyncClient

    value = _parse_inputs(inputs, inputs_file)
    if dtype is not None:
        try:
            value = np.asarray(value, dtype=np.dtype(dtype))
        except (TypeError, ValueError) as exc:
            raise fail(f"--dtype {dtype}: {exc}") from exc

    async def go() -> int:
        async with AsyncClient(broker, results, namespace=namespace) as client:
            rid = await client.submit(model, value, request_id=request_id, priority=priority,
                                      deadline_s=deadline_s)
            if wait is None:
                typer.echo(json.dumps({"request_id": rid}) if as_json else rid)
                return 0
            return _print_result(await client.wait(rid, wait), as_json)

    _exit_with(go)


def _exit_with(go: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """Run a client coroutine; its int is the exit code, and our errors exit 1 cleanly."""
    from schemas.errors import BatchfleetError

    try:
        code = asyncio.run(go())
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    raise typer.Exit(code)


def _print_result(result: Any, as_json: bool) -> int:
    from schemas.json_form import result_to_json

    body = result_to_json(result)
    if as_json:
        typer.echo(json.dumps(body))
    else:
        for key, value in body.items():
            if value is not None:
                typer.echo(f"{key:>14}: {value}")
    return {"succeeded": 0, "pending": 3}.get(result.status, 1)


@app.command()
def result(
    request_id: Annotated[str, typer.Argument(help="The request ID submit printed.")],
    broker: BrokerOpt,
    results: ResultsOpt = None,
    wait: Annotated[float | None, typer.Option(
        help="Wait up to this many seconds for a terminal status.")] = None,
    namespace: NamespaceOpt = "bf",
    as_json: JsonOpt = False,
) -> None:
    """Print a request's result. Exit code: 0 succeeded, 1 failed/expired, 3 pending, 4 unknown.

    Examples:

        batchfleet result 3f2a9c... --broker redis://localhost:6379/0

        batchfleet result 3f2a9c... --wait 30 --json
    """
    from producers import AsyncClient

    async def go() -> int:
        async with AsyncClient(broker, results, namespace=namespace) as client:
            found = await (client.wait(request_id, wait) if wait is not None
                           else client.get(request_id))
            if found is None:
                typer.secho(f"unknown request {request_id} (never submitted, or expired from "
                            "the result store)", err=True)
                return 4
            return _print_result(found, as_json)

    _exit_with(go)


@app.command()
def demo(
    broker: Annotated[str | None, typer.Option(
        "--broker", envvar="BATCHFLEET_BROKER",
        help="Broker URL; 'kafka' starts the bundled Kafka-compatible broker. "
             "Default: an embedded Redis on a free port.")] = None,
    results: ResultsOpt = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="How many requests.")
                        ] = 10_000,
    model: Annotated[str, typer.Option("--model", "-m", help="demo-mlp or demo-encoder.")
                     ] = "demo-mlp",
    max_batch_size: Annotated[int, typer.Option(help="Worker's max batch size.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="Worker's max wait.")] = 5.0,
    timeout_s: Annotated[float, typer.Option(help="Give up waiting after this long.")] = 300.0,
    as_json: JsonOpt = False,
) -> None:
    """Run the whole pipeline end to end and print throughput and latency.

    With no broker configured it starts a real Redis on a free loopback port,
    a worker process, submits --requests requests and waits for every result.
    Exits non-zero if any request lacks a terminal result.

    Examples:

        batchfleet demo

        batchfleet demo --requests 2000 --model demo-encoder

        batchfleet demo --broker kafka

        batchfleet demo --broker redis://localhost:6379/0
    """
    from batchfleet.demo import DemoOptions, run_demo
    from schemas.errors import ConfigError

    try:
        code = run_demo(DemoOptions(broker, results, requests, model, max_batch_size,
                                    max_wait_ms, timeout_s, as_json))
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    raise typer.Exit(code)


app.add_typer(dlq_app, name="dlq")
app.add_typer(bulk_app, name="bulk")
app.add_typer(gateway_app, name="gateway")
app.add_typer(webhooks_app, name="webhooks")
app.command()(bench)
app.command()(status)


def main() -> None:
    app(prog_name="batchfleet")


if __name__ == "__main__":
    main()
