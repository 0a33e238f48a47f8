"""``submit`` and ``result``: one request from the shell.

Both print data through the one output switch (``-o table|wide|json|yaml``, ``--json``
= ``-o json``), so a script pipes their stdout into ``jq``; their refusals and errors are
one line on stderr with an empty stdout. ``--wait`` bounds the whole command, connecting
included: with the store down it ends after about ``--wait`` seconds, not the SDK's own
reconnect budget.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from batchfleet.options import (
    EXIT_FAILED,
    EXIT_USAGE,
    BrokerOpt,
    CallbackAllowNetsOpt,
    CallbackHostsOpt,
    CallbackSchemesOpt,
    JsonOpt,
    NamespaceOpt,
    ResultsOpt,
    error_line,
    fail,
)
from batchfleet.output import OutputOpt, dump, output_format
from batchfleet.schemas.envelopes import DEGRADE_ALLOW, DEGRADE_CHOICES
from batchfleet.schemas.settings import DEFAULT_CALLBACK_SCHEMES, DEFAULT_NAMESPACE

#: ``submit --wait`` and ``result``: a request still pending (README "Exit codes").
EXIT_PENDING = 3
#: ``result``: no record of this ID.
EXIT_UNKNOWN = 4
#: Time beyond ``--wait`` for the final read and closing the connections.
_CLOSE_S = 1.0

WaitOpt = Annotated[float | None, typer.Option(
    "--wait", metavar="SECONDS", min=0,
    help="Wait up to this many seconds for a terminal status; bounds the whole command.")]


def _parse_inputs(inputs: str | None, inputs_file: Path | None) -> Any:
    import numpy as np

    if (inputs is None) == (inputs_file is None):
        raise fail("give exactly one of --inputs JSON or --inputs-file FILE.npy")
    if inputs_file is not None:
        try:
            return np.load(inputs_file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise fail(f"--inputs-file {str(inputs_file)!r} is not a readable .npy array "
                       f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); "
                       "for JSON rows use --inputs or `batchfleet bulk run`") from exc
    try:
        return json.loads(inputs)  # type: ignore[arg-type]
    except json.JSONDecodeError as exc:
        raise fail(f"--inputs is not valid JSON: {exc}") from exc


def _cast(value: Any, dtype: str | None) -> Any:
    import numpy as np

    if dtype is None:
        return value
    try:
        return np.asarray(value, dtype=np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise fail(f"--dtype {dtype}: {exc}") from exc


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
    callback_url: Annotated[str | None, typer.Option(
        help="POST the result here when it is terminal (needs `batchfleet webhooks "
             "worker`); checked against the --callback-* allowlist.")] = None,
    callback_schemes: CallbackSchemesOpt = DEFAULT_CALLBACK_SCHEMES,
    callback_hosts: CallbackHostsOpt = "",
    callback_allow_nets: CallbackAllowNetsOpt = "",
    degrade: Annotated[str, typer.Option(
        metavar="allow|never",
        help="never: fail closed (unavailable) where the model's fallback chain would "
             "answer; allow: take its answer, marked degraded (docs/degradation.md).")
    ] = DEGRADE_ALLOW,
    wait: WaitOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    output: OutputOpt = "table",
    as_json: JsonOpt = False,
) -> None:
    """Submit one request and print its ID (or, with --wait, its result).

    Exit code: 0 submitted (or succeeded), 1 failed, expired or cancelled, 2 refused
    (bad inputs, unknown model, callback outside the allowlist; nothing was sent),
    3 still pending after --wait (its ID is printed on stderr).

    Examples:

        batchfleet submit -m demo-mlp --inputs '[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]' --wait 5

        batchfleet submit -m demo-encoder --inputs-file tokens.npy --priority bulk

        batchfleet submit -m demo-mlp --inputs '[0.5]' -o json | jq -r .request_id

        batchfleet submit -m fraud --inputs-file tx.npy --degrade never --wait 5
    """
    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.producers import AsyncClient
    from batchfleet.schemas.errors import ConfigError, WaitTimeoutError

    fmt = output_format(output, as_json)
    if degrade not in DEGRADE_CHOICES:
        raise fail(f"--degrade {degrade!r}: give allow or never")
    value = _cast(_parse_inputs(inputs, inputs_file), dtype)
    try:
        policy = CallbackPolicy.parse(callback_schemes, callback_hosts, callback_allow_nets)
    except ConfigError as exc:
        raise fail(str(exc)) from exc

    sent: list[str] = []  # once submitted, a timeout is "pending", never "no answer"

    def still_pending() -> int:  # it stays queued: say which ID to ask about later
        rid = sent[0]
        if fmt in ("json", "yaml"):
            dump({"request_id": rid, "status": "pending"}, fmt)
        typer.secho(f"request {rid} is still pending after {wait or 0:g}s; ask again with "
                    f"`batchfleet result {rid} --wait SECONDS`", err=True)
        return EXIT_PENDING

    async def go() -> int:
        async with AsyncClient(broker, results, namespace=namespace,
                               callback_policy=policy) as client:
            rid = await client.submit(model, value, request_id=request_id, priority=priority,
                                      deadline_s=deadline_s, callback_url=callback_url,
                                      degrade=degrade)
            sent.append(rid)
            if wait is None:
                _print({"request_id": rid}, fmt, plain=rid)
                return 0
            try:
                told.append(_print_result(await client.wait(rid, wait), fmt))
            except WaitTimeoutError:
                told.append(still_pending())
            return told[0]

    told: list[int] = []  # what was printed, should closing the client run out of time
    _exit_with(go, wait, lambda: told[0] if told else still_pending() if sent else None)


def result(
    request_id: Annotated[str, typer.Argument(help="The request ID submit printed.")],
    broker: BrokerOpt,
    results: ResultsOpt = None,
    wait: WaitOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    output: OutputOpt = "table",
    as_json: JsonOpt = False,
    show_steps: Annotated[bool, typer.Option(
        "--show-steps", help="A pipeline's result: each step's record and its own output "
        "(kept under ID:STEP while the store keeps results; docs/pipelines.md).")] = False,
) -> None:
    """Print a request's result.

    Exit code: 0 succeeded, 1 failed, expired or cancelled, 3 pending, 4 unknown ID.

    Examples:

        batchfleet result 3f2a9c... --broker redis://localhost:6379/0

        batchfleet result 3f2a9c... --wait 30 -o json | jq .outputs

        batchfleet result 3f2a9c... --show-steps
    """
    from batchfleet.producers import AsyncClient
    from batchfleet.schemas.errors import WaitTimeoutError

    fmt = output_format(output, as_json)

    async def go() -> int:
        async with AsyncClient(broker, results, namespace=namespace) as client:
            try:
                found = await (client.wait(request_id, wait) if wait is not None
                               else client.get(request_id))
            except WaitTimeoutError:  # pending still: the documented exit 3, not a failure
                found = await client.get(request_id)
            if found is None:
                if fmt in ("json", "yaml"):
                    dump({"request_id": request_id, "status": "unknown"}, fmt)
                typer.secho(f"unknown request {request_id} (never submitted, or expired from "
                            "the result store)", err=True)
                return EXIT_UNKNOWN
            outputs = None
            if show_steps and found.steps:
                names = [str(x.get("step")) for x in found.steps]
                got = [await client.get(f"{request_id}:{n}") for n in names]
                outputs = {n: (None if r is None else r.outputs) for n, r in zip(
                    names, got, strict=True)}
            return _print_result(found, fmt, outputs)

    _exit_with(go, wait)


def _exit_with(go: Callable[[], Coroutine[Any, Any, int]], wait: float | None,
               timed_out: Callable[[], int | None] = lambda: None) -> None:
    """Run a client coroutine, within ``wait`` (plus closing time) when given; its int is
    the exit code. Its errors are one line: 2 when refused before anything was sent
    (``exit_code``), else 1. Past ``wait``, ``timed_out`` gives the exit code if it has
    one (``submit``: its ID was returned, so the request is pending)."""
    from batchfleet.schemas.errors import BatchfleetError
    from batchfleet.schemas.registry import UnregisteredModelError

    async def bounded() -> int:
        if wait is None:
            return await go()
        async with asyncio.timeout(wait + _CLOSE_S):
            return await go()

    try:
        code = asyncio.run(bounded())
    except UnregisteredModelError as exc:  # the shell's advice: declare it, no Python option
        raise fail(exc.advice("cli"), EXIT_USAGE) from exc
    except BatchfleetError as exc:
        raise fail(*error_line(exc)) from exc
    except TimeoutError as exc:
        late = timed_out()
        if late is None:
            raise fail(f"no answer from the broker or result store within --wait {wait:g}s: "
                       "is Redis running? check --broker/--results", EXIT_FAILED) from exc
        code = late
    raise typer.Exit(code)


def _print(body: dict[str, Any], fmt: str, *, plain: str) -> None:
    if fmt in ("json", "yaml"):
        dump(body, fmt)
    else:
        typer.echo(plain)


def _print_result(result: Any, fmt: str, step_outputs: dict[str, Any] | None = None) -> int:
    """The result; with ``step_outputs`` (``--show-steps``), each step's own output beside
    its record (null once its result has expired, and for a join, which stores none)."""
    from batchfleet.schemas.json_form import result_to_json, tensors_to_json

    body = result_to_json(result)  # the wire form (docs/wire-format.md), as over HTTP
    if step_outputs is not None:
        body["steps"] = [{**step, "outputs": tensors_to_json(step_outputs.get(step["step"]))}
                         for step in body.get("steps", [])]
    if fmt in ("json", "yaml"):
        dump(body, fmt)
    else:
        for key, value in body.items():
            if value is not None and value != "" and not (key == "steps" and step_outputs):
                typer.echo(f"{key:>14}: {_result_cell(key, value)}")
        for step in body["steps"] if step_outputs is not None else []:
            typer.echo(f"step {step['step']}: " + ", ".join(
                f"{k}={_result_cell(k, v)}" for k, v in step.items() if k != "step"))
    return {"succeeded": 0, "pending": EXIT_PENDING}.get(result.status, EXIT_FAILED)


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
