"""The ``batchfleet`` command line: the one place settings are read from the environment.

Every option that has a ``BATCHFLEET_*`` variable reads it here, through
typer's ``envvar``; everything below receives plain values or a settings object.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from typer.core import TyperGroup, TyperOption

from batchfleet import __version__
from batchfleet.cli_bench import bench
from batchfleet.cli_bulk import bulk_app
from batchfleet.cli_control import cancel, check, lane_app
from batchfleet.cli_dlq import dlq_app
from batchfleet.cli_gateway import gateway_app
from batchfleet.cli_models import models_app
from batchfleet.cli_rollout import rollout_app
from batchfleet.cli_status import status
from batchfleet.cli_webhooks import webhooks_app
from batchfleet.options import (
    BrokerOpt,
    JsonOpt,
    NamespaceOpt,
    ResultsOpt,
    error_line,
    fail,
    handled,
    missing_extra,
)


class _Commands(TyperGroup):
    """The one place every command's errors become one line and an exit code.

    Subcommands import their extras lazily; a missing one is one line naming the extra.
    The project's errors, and driver or network errors that reach this far, are one
    line too (docs/operations.md "Exit codes"); ``--debug`` re-raises for the traceback.
    """

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            exit_ = missing_extra(ctx.invoked_subcommand or "", exc)
            if exit_ is None:
                raise
            raise exit_ from None
        except BrokenPipeError:  # `batchfleet ... | head`: the reader left; nothing to say
            _quiet_stdout()
            raise SystemExit(0) from None
        except (Exception, BaseExceptionGroup) as exc:  # filtered just below
            if not handled(exc) or ctx.meta.get(_DEBUG):
                raise
            message, code = error_line(exc)
            raise fail(message, code) from None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush into the closed pipe
    does not print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """A flag takes no value: no ``<bool>`` beside it in --help (``--json true`` is wrong)."""
    if self.is_flag and self.metavar is None:
        return None
    return _option_type(self, ctx)


_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]
_DEBUG = "batchfleet.debug"


app = typer.Typer(
    name="batchfleet",
    cls=_Commands,
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
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="BATCHFLEET_DEBUG",
        help="On an error, show the full traceback, not just one line.")] = False,
) -> None:
    """Asynchronous micro-batching PyTorch inference workers fed by Redis Streams or Kafka.

    Exit codes: 0 ok, 1 the operation failed (or Redis/Kafka could not be reached),
    2 bad usage or configuration; `result` and `bulk` add their own (see their --help).

    Examples:

        batchfleet demo

        batchfleet --debug status --broker redis://localhost:6379/0
    """
    ctx.meta[_DEBUG] = debug
    if ctx.invoked_subcommand != "worker":
        # a client's own one-line error says it all; aiokafka would log its raw connect
        # failure first (the worker configures its logging itself and keeps these)
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


class _WorkerCommand(typer.core.TyperCommand):
    """The worker command, its options generated from the settings on first use.

    Generating them imports the worker package (torch), so it waits until ``worker``
    itself is parsed or helped: the other commands, and a slim install, never pay it.
    """

    _generated = False

    def _generate(self) -> None:
        if self._generated:
            return
        from typer.main import get_command_from_info
        from typer.models import CommandInfo

        from batchfleet.cli_worker import worker_function

        inner = get_command_from_info(CommandInfo(callback=worker_function(_run_worker)),
                                      pretty_exceptions_short=True, rich_markup_mode="markdown")
        self.params = list(inner.params)
        self.callback = inner.callback
        self._generated = True

    def get_params(self, ctx: Any) -> Any:
        self._generate()
        return super().get_params(ctx)


@app.command(cls=_WorkerCommand)
def worker() -> None:
    """Run a worker: fetch, micro-batch, compute, write results, ack.

    Every option also reads its BATCHFLEET_* variable; a flag wins over the variable,
    the variable over the default. Per-model options take VALUE (every model) or
    MODEL[@VERSION]=VALUE (one model), repeatable; their variable takes the same
    entries comma-separated, e.g. BATCHFLEET_RETRY="demo-mlp=5:0.1,demo-encoder=2".

    Examples:

        batchfleet worker --broker redis://localhost:6379/0 --model demo-mlp

        batchfleet worker --broker kafka://kafka:9092 --results redis://redis:6379/0 -m demo-encoder

        batchfleet worker --broker redis://localhost:6379/0 --model fraud=mypkg.models:build

        batchfleet worker -m demo-mlp -m demo-encoder --retry 5 --retry demo-encoder=2:0.2:10

        batchfleet worker --broker redis://:secret@localhost:6379/0 --print-config
    """


def _run_worker(ctx: typer.Context, values: dict[str, Any]) -> None:
    import os

    from batchfleet.cli_worker import config_lines, resolve, source_of
    from batchfleet.schemas.errors import BatchfleetError, ConfigError

    try:
        settings, process = resolve(values)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if values.get("print_config"):
        for line in config_lines(settings, process, source_of(ctx)):
            typer.echo(line)
        raise typer.Exit(0)

    # OpenMP reads these once, when torch loads it: set them before anything imports torch.
    # PASSIVE: idle torch threads sleep instead of spinning on cores the event loop needs.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if process.torch_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(process.torch_threads)

    from batchfleet.workers import Worker
    from batchfleet.workers.logs import configure_logging

    try:
        configure_logging(process.log_format, process.log_level)
        Worker(settings).run()
    except BatchfleetError as exc:
        # a port taken, a store or broker not answering, a model that will not load: one
        # line says which; the traceback helps only whoever debugs batchfleet itself
        if process.debug:
            raise
        raise fail(str(exc), 1) from exc


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

    Exit code: 0 submitted (or succeeded), 1 failed/expired, 3 still pending after --wait
    (its ID is printed on stderr).

    Examples:

        batchfleet submit -m demo-mlp --inputs '[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]' --wait 5

        batchfleet submit -m demo-encoder --inputs-file tokens.npy --priority bulk
    """
    from batchfleet.producers import AsyncClient
    from batchfleet.schemas.errors import WaitTimeoutError

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
            try:
                return _print_result(await client.wait(rid, wait), as_json)
            except WaitTimeoutError:  # it stays queued: say which ID to ask about later
                if as_json:
                    typer.echo(json.dumps({"request_id": rid, "status": "pending"}))
                typer.secho(f"request {rid} is still pending after {wait:g}s; ask again with "
                            f"`batchfleet result {rid} --wait SECONDS`", err=True)
                return 3

    _exit_with(go)


def _exit_with(go: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """Run a client coroutine; its int is the exit code. Its errors exit 1, whatever their
    kind (a request that could not be made failed, as one whose result failed)."""
    from batchfleet.schemas.errors import BatchfleetError
    from batchfleet.schemas.registry import UnregisteredModelError

    try:
        code = asyncio.run(go())
    except UnregisteredModelError as exc:  # the shell's advice: declare it, no Python option
        raise fail(exc.advice("cli"), 1) from exc
    except BatchfleetError as exc:
        raise fail(error_line(exc)[0], 1) from exc
    raise typer.Exit(code)


def _print_result(result: Any, as_json: bool) -> int:
    from batchfleet.schemas.json_form import result_to_json

    body = result_to_json(result)
    if as_json:
        typer.echo(json.dumps(body))
    else:
        for key, value in body.items():
            if value is not None and value != "":
                typer.echo(f"{key:>14}: {_result_cell(key, value)}")
    return {"succeeded": 0, "pending": 3}.get(result.status, 1)


def _result_cell(key: str, value: Any) -> str:
    """A result field for people: local times, ``type: message`` errors, JSON tensors."""
    from batchfleet.output import human_time

    if key.endswith("_at") and isinstance(value, int | float):
        return human_time(value)
    if key.endswith("_ms") and isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, dict) and "type" in value and "message" in value:
        return f"{value['type']}: {value['message']}"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


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
    from batchfleet.producers import AsyncClient
    from batchfleet.schemas.errors import WaitTimeoutError

    async def go() -> int:
        async with AsyncClient(broker, results, namespace=namespace) as client:
            try:
                found = await (client.wait(request_id, wait) if wait is not None
                               else client.get(request_id))
            except WaitTimeoutError:  # pending still: the documented exit 3, not a failure
                found = await client.get(request_id)
            if found is None:
                if as_json:
                    typer.echo(json.dumps({"request_id": request_id, "status": "unknown"}))
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
    from batchfleet.schemas.errors import ConfigError

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
app.add_typer(models_app, name="models")
app.add_typer(rollout_app, name="rollout")
app.command()(bench)
app.command()(status)
app.command()(cancel)
app.command()(check)
app.add_typer(lane_app, name="lane")


def main() -> None:
    app(prog_name="batchfleet")


if __name__ == "__main__":
    main()
