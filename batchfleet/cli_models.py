"""``batchfleet models declare | list | show | undeclare | check | pause | resume``: the
model registry by hand, and a model tried locally (``check``: ``cli_models_check``).

Declaring a model before any worker serves it lets producers submit to it at
once (the requests wait in its lane), and gives submits an input spec to be
checked against. See docs/operations.md, "Deploy order".
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from batchfleet.cli_models_check import check
from batchfleet.connectors.model_registry import ModelRegistry, Undeclared
from batchfleet.options import (
    BrokerOpt,
    JsonOpt,
    NamespaceOpt,
    ResultsOpt,
    fail,
    renamed,
    run_against,
)
from batchfleet.output import (
    Column,
    NoHeadersOpt,
    OutputOpt,
    console,
    dump,
    human_time,
    iso_times,
    output_format,
    render,
    table,
)
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import Declaration, ModelRecord
from batchfleet.schemas.settings import DEFAULT_NAMESPACE
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.validation import check_model_name

T = TypeVar("T")

models_app = typer.Typer(
    help="Declare models ahead of their workers, read the model registry, and check a "
         "model locally.\n\n"
         "Examples:\n\n    batchfleet models declare fraud --input float32[10]\n\n"
         "    batchfleet models list\n\n    batchfleet models check textclf.model:build",
    no_args_is_help=True, rich_markup_mode="markdown")
models_app.command()(check)

NameArg = Annotated[str, typer.Argument(help="The model's name.")]


def _run(broker: str, results: str | None, namespace: str,
         body: Callable[[ModelRegistry], Awaitable[T]]) -> T:
    """Run ``body`` against the registry; our errors exit 1 with one line."""
    return run_against(lambda plane: plane.models, broker, results, namespace, body)


def _spec(option: str, text: str | None) -> TensorSpec | None:
    if text is None:
        return None
    try:
        return TensorSpec.parse(text)
    except BatchfleetError as exc:
        raise fail(f"{option}: {exc}") from exc


@models_app.command()
def declare(
    name: NameArg, broker: BrokerOpt,
    input_spec: Annotated[str | None, typer.Option(
        "--input-spec", "--input", metavar="DTYPE[SHAPE]",
        help="Per-request input, e.g. float32[10]; submits off it are refused at once.")
    ] = None,
    output_spec: Annotated[str | None, typer.Option(
        "--output-spec", metavar="DTYPE[SHAPE]", help="Per-request output, e.g. float32[1].")
    ] = None,
    results: ResultsOpt = None, namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    old_output: Annotated[str | None, typer.Option(
        "--output", hidden=True, help="Deprecated spelling of --output-spec.")] = None,
) -> None:
    """Declare a model before any worker serves it: submits are accepted and wait in its
    lane until a worker starts. Declaring again replaces the specs.

    Examples:

        batchfleet models declare fraud --input-spec float32[10] --output-spec float32[1] --broker redis://localhost:6379/0

        batchfleet models declare ranker --input-spec int64[64]
    """
    try:
        check_model_name(name)
    except BatchfleetError as exc:
        raise fail(str(exc)) from exc
    output_spec = renamed("--output-spec", output_spec, "--output", old_output)
    declaration = Declaration(time.time(), _spec("--input-spec", input_spec),
                              _spec("--output-spec", output_spec))
    _run(broker, results, namespace, lambda registry: registry.declare(name, declaration))
    spec = f" ({declaration.input.describe()})" if declaration.input else ""
    typer.echo(f"declared {name}{spec}")


@models_app.command()
def undeclare(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
              namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Withdraw a declaration. A model no live worker serves is removed from the registry
    (submits to it are refused again); one still served stays listed, as served.

    Example:

        batchfleet models undeclare fraud --broker redis://localhost:6379/0
    """
    done = _run(broker, results, namespace, lambda registry: registry.undeclare(name))
    if done is Undeclared.UNKNOWN:
        raise fail(f"unknown model {name!r}: nothing to undeclare", 1)
    if done is Undeclared.STILL_SERVED:
        typer.echo(f"{name} is no longer declared; live workers serve it, so it stays listed")
        return
    typer.echo(f"removed {name}")


@models_app.command("list")
def list_(broker: BrokerOpt, results: ResultsOpt = None,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE,
          output: OutputOpt = "table", no_headers: NoHeadersOpt = False,
          as_json: JsonOpt = False) -> None:
    """List every model submits are accepted for: declared, served, or both.

    Examples:

        batchfleet models list --broker redis://localhost:6379/0

        batchfleet models list -o json
    """
    fmt = output_format(output, as_json)
    records = _run(broker, results, namespace, lambda registry: registry.records())
    now = time.time()
    rows = [{"model": r.name, "declared": _declared(r),
             "versions": ", ".join(f"{v.label}={v.version}" for v in r.versions.values())
             or "—", "live": len(r.live_workers(now)), "loaded": _loaded_on(r, now),
             "source": _sources(r), "stable": r.policy.stable,
             "shards": r.lane_shards} for r in records]
    render(rows, COLUMNS, fmt, no_headers, title=f"models ({len(records)})",
           body=iso_times([r.to_json(now) for r in records]))


COLUMNS = (Column("model"), Column("declared", "declared input"), Column("versions"),
           Column("live", "live workers"), Column("loaded", "loaded on"),
           Column("source"), Column("stable"), Column("shards"))


def _loaded_on(record: ModelRecord, now: float) -> str:
    """The live workers holding the model in memory (docs/models.md, "Loading on
    demand"): all that serve it, unless they load models on demand."""
    live = [record.served[w] for w in record.live_workers(now)]
    holding = [s.worker_id for s in live if s.loaded is not False]
    return ", ".join(holding) or "—"


def _sources(record: ModelRecord) -> str:
    """Where each version comes from: its repository folder, or ``--model``."""
    return ", ".join(sorted({v.source or "--model" for v in record.versions.values()})) or "—"


@models_app.command()
def show(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
         namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False,
         output: OutputOpt = "table", no_headers: NoHeadersOpt = False) -> None:
    """Show one model's registry record: versions and specs, declaration, serving workers
    with when each was last seen, rollout policy and lane shards.

    Examples:

        batchfleet models show demo-mlp

        batchfleet models show demo-mlp --json

        batchfleet models show demo-mlp -o wide --no-headers
    """
    fmt = output_format(output, as_json)
    record = _run(broker, results, namespace, lambda registry: registry.get(name))
    if record is None:
        raise fail(f"unknown model {name!r}: no worker serves it and it is not declared; "
                   f"declare it with `batchfleet models declare {name} --input DTYPE[SHAPE]`", 1)
    now = time.time()
    if fmt in ("json", "yaml"):
        dump(iso_times(record.to_json(now)), fmt)
        return
    _print_record(record, now, wide=fmt == "wide", no_headers=no_headers)


VERSION_COLUMNS = (Column("label"), Column("version"), Column("input", wide=True),
                   Column("output", wide=True))
SERVED_COLUMNS = (Column("worker"), Column("last_seen", "last seen", show=human_time),
                  Column("live"), Column("labels", wide=True))


def _print_record(record: ModelRecord, now: float, *, wide: bool, no_headers: bool) -> None:
    """The record's one-value facts as lines (not with ``no_headers``), then its versions
    and serving workers as tables (whole worker IDs, local times)."""
    from batchfleet.cli_rollout import describe

    out = console()
    if not no_headers:
        declared = record.declared
        out.print(f"{record.name}: declared {_declared(record)}"
                  + (f" at {human_time(declared.at)}" if declared is not None else "")
                  + f"; rollout epoch {record.policy.epoch}, {describe(record.policy)}; "
                  f"lane shards {record.lane_shards}")
    versions = [{"label": label, "version": v.version,
                 "input": v.input.describe() if v.input else "any",
                 "output": v.output.describe() if v.output else "any"}
                for label, v in sorted(record.versions.items())]
    served = [{"worker": s.worker_id, "last_seen": s.at,
               "live": "yes" if s.live(now) else "no", "labels": ", ".join(s.labels)}
              for s in sorted(record.served.values(), key=lambda s: s.worker_id)]
    for rows, columns, title, none in (
            (versions, VERSION_COLUMNS, "versions", "none registered (no worker yet)"),
            (served, SERVED_COLUMNS, "served by", "no worker yet")):
        if rows:
            out.print(table(rows, columns, wide=wide, no_headers=no_headers, title=title))
        elif not no_headers:
            out.print(f"{title}: {none}")


def _declared(record: ModelRecord) -> str:
    if record.declared is None:
        return "—"
    return record.declared.input.describe() if record.declared.input else "any"


# ``models baseline`` and ``models outputs`` (output statistics) live in their own module.
from batchfleet.cli_models_outputs import baseline, outputs  # noqa: E402

models_app.command()(baseline)
models_app.command()(outputs)

WhoOpt = Annotated[str | None, typer.Option(
    "--who", envvar="BATCHFLEET_WHO", help="Who paused: shown by `status` and the console. "
    "Default: user@host.")]


@models_app.command()
def pause(name: NameArg, broker: BrokerOpt,
          why: Annotated[str, typer.Option(
              "--why", help="Why: shown by `status` and the console while paused.")] = "",
          who: WhoOpt = None, results: ResultsOpt = None,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Pause a model's lanes: every worker stops fetching them within about a second (as
    an open breaker does); its requests wait in the queue, those already fetched finish.
    The same flag as the console's Pause; `status` lists paused models.

    Examples:

        batchfleet models pause fraud --why "feature store outage" --broker redis://localhost:6379/0

        batchfleet models resume fraud
    """
    from batchfleet.connectors.rollout import default_who
    from batchfleet.schemas.registry import Pause

    _run(broker, results, namespace, lambda registry: registry.set_paused(
        name, Pause(time.time(), who or default_who(), why)))
    typer.echo(f"{name}: lanes paused (`batchfleet models resume {name}` resumes them)")


@models_app.command()
def resume(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
           namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Resume a model's paused lanes: workers fetch them again within about a second.

    Example:

        batchfleet models resume fraud --broker redis://localhost:6379/0
    """
    _run(broker, results, namespace, lambda registry: registry.set_paused(name, None))
    typer.echo(f"{name}: lanes resumed")
