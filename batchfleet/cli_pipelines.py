"""``batchfleet pipelines declare | list | show | status | remove``: pipelines by hand.

A pipeline is declared once, in the control plane, and then submitted to like a model
(docs/pipelines.md). Declaring checks every edge whose ends have specs in the model
registry and refuses an incompatible one in one line naming it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from batchfleet.connectors.control_plane import ControlPlane
from batchfleet.connectors.pipelines import declare_checked
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail, run_against
from batchfleet.output import Column, NoHeadersOpt, OutputOpt, dump, output_format, render
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.pipeline import Pipeline, from_steps, from_toml
from batchfleet.schemas.settings import DEFAULT_NAMESPACE

if TYPE_CHECKING:
    from batchfleet.connectors.fleet import FleetSnapshot

pipelines_app = typer.Typer(
    help="Declare pipelines (one request through several models, each step a queue hop) "
         "and read them.\n\nExamples:\n\n"
         "    batchfleet pipelines declare embed --steps demo-tokenize,demo-encoder\n\n"
         "    batchfleet pipelines declare ens --file ensemble.toml\n\n"
         "    batchfleet pipelines list",
    no_args_is_help=True, rich_markup_mode="markdown")

NameArg = Annotated[str, typer.Argument(help="The pipeline's name (shares the model namespace).")]


def _plane(plane: ControlPlane) -> ControlPlane:
    return plane


@pipelines_app.command()
def declare(
    name: NameArg, broker: BrokerOpt,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="A pipeline.toml with [[step]] tables (docs/pipelines.md).",
        exists=True, dir_okay=False)] = None,
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="MODEL,MODEL[@VERSION],...",
        help="A linear chain: each step's output is the next step's input.")] = None,
    keep_intermediate_s: Annotated[float | None, typer.Option(
        "--keep-intermediate-s", metavar="S", min=0.0,
        help="Keep each step's output this long after the request ends (audit, "
             "`result ID --show-steps`); 0: not kept.")] = None,
    results: ResultsOpt = None, namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Declare (or replace) a pipeline. Its name must not be a model's; every step's
    model must be declared or served; an edge whose two ends have specs must match.

    Examples:

        batchfleet pipelines declare embed --steps demo-tokenize,demo-encoder --broker redis://localhost:6379/0

        batchfleet pipelines declare ens --file ensemble.toml --keep-intermediate-s 600
    """
    if (file is None) == (steps is None):
        raise fail("give exactly one of --file and --steps")
    try:
        pipeline = (from_toml(name, file.read_text(), keep_intermediate_s) if file is not None
                    else from_steps(name, steps or "", keep_intermediate_s or 0.0))
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    unchecked = run_against(_plane, broker, results, namespace,
                            lambda plane: declare_checked(plane.models, plane.pipelines,
                                                          pipeline))
    typer.echo(f"declared pipeline {name}: {pipeline.describe()}")
    if unchecked:
        typer.echo(f"checked on the first request (no declared spec): {', '.join(unchecked)}")


COLUMNS = (Column("pipeline"), Column("steps"), Column("output"), Column("keep", "keep s"))


def _row(p: Pipeline) -> dict[str, object]:
    return {"pipeline": p.name, "steps": p.describe(), "output": p.output.name,
            "keep": p.keep_intermediate_s}


@pipelines_app.command("list")
def list_(broker: BrokerOpt, results: ResultsOpt = None,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "table",
          no_headers: NoHeadersOpt = False, as_json: JsonOpt = False) -> None:
    """List every declared pipeline and its steps.

    Example:

        batchfleet pipelines list --broker redis://localhost:6379/0
    """
    fmt = output_format(output, as_json)
    found = run_against(lambda plane: plane.pipelines, broker, results, namespace,
                        lambda reg: reg.all())
    render([_row(p) for p in found], COLUMNS, fmt, no_headers,
           title=f"pipelines ({len(found)})", body=[p.to_wire() for p in found])


@pipelines_app.command()
def show(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
         namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "json",
         as_json: JsonOpt = False) -> None:
    """Show one pipeline's record.

    Example:

        batchfleet pipelines show embed
    """
    found = run_against(lambda plane: plane.pipelines, broker, results, namespace,
                        lambda reg: reg.get(name))
    if found is None:
        raise fail(f"unknown pipeline {name!r}", 1)
    fmt = output_format(output, as_json)
    dump(found.to_wire(), "yaml" if fmt == "yaml" else "json")


@pipelines_app.command()
def remove(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
           namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Remove a pipeline: later submits to its name are refused; requests under way end
    as their steps do.

    Example:

        batchfleet pipelines remove embed
    """
    if not run_against(lambda plane: plane.pipelines, broker, results, namespace,
                       lambda reg: reg.remove(name)):
        raise fail(f"unknown pipeline {name!r}: nothing to remove", 1)
    typer.echo(f"removed pipeline {name}")


STATUS_COLUMNS = (Column("step"), Column("model"), Column("depth"), Column("lag"),
                  Column("p99_ms", "p99 ms"), Column("error_rate", "errors"), Column("dlq"),
                  Column("workers"), Column("rps", "req/s"))


def status_rows(pipeline: Pipeline, snapshot: FleetSnapshot) -> list[dict[str, object]]:
    """Each step's figures from its model's lanes in one fleet snapshot (no scans): depth
    and lag summed over the lanes (a pinned version's lane too), the worst lane p99, and
    the model's error rate, dead letters, workers and rate. A join has no lane: '—'."""
    rows: list[dict[str, object]] = []
    for node in pipeline.nodes:
        if node.model is None:
            rows.append({"step": node.name, "model": f"join:{node.join}", **dict.fromkeys(
                ("depth", "lag", "p99_ms", "error_rate", "dlq", "workers", "rps"), "—")})
            continue
        names = {node.model, node.target}
        lanes = [lane for lane in snapshot.lanes if lane.model in names]
        p99 = [lane.p99_ms for lane in lanes if lane.p99_ms is not None]
        rows.append({
            "step": node.name, "model": node.target,
            "depth": sum(lane.depth or 0 for lane in lanes),
            "lag": sum(lane.lag or 0 for lane in lanes),
            "p99_ms": round(max(p99), 1) if p99 else "—",
            "error_rate": next((lane.error_rate for lane in lanes
                                if lane.error_rate is not None), "—"),
            "dlq": max((lane.dlq for lane in lanes), default=0),
            "workers": max((lane.workers for lane in lanes), default=0),
            "rps": max((lane.throughput_rps for lane in lanes), default=0.0)})
    return rows


@pipelines_app.command()
def status(name: NameArg, broker: BrokerOpt, results: ResultsOpt = None,
           namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "table",
           no_headers: NoHeadersOpt = False, as_json: JsonOpt = False) -> None:
    """Each step's depth, lag, p99, error rate and dead letters, from its model's lanes
    (one fleet snapshot: the figures `batchfleet status` shows, per step).

    Example:

        batchfleet pipelines status embed --broker redis://localhost:6379/0
    """
    from batchfleet.options import open_doors

    fmt = output_format(output, as_json)

    async def go() -> tuple[Pipeline | None, FleetSnapshot]:
        plane, door = open_doors(broker, results, namespace)
        reader = plane.fleet(door)
        try:
            return await plane.pipelines.get(name), await reader.read()
        finally:
            await reader.close()
            await plane.close()

    try:
        found, snapshot = asyncio.run(go())
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    if found is None:
        raise fail(f"unknown pipeline {name!r}", 1)
    render(status_rows(found, snapshot), STATUS_COLUMNS, fmt, no_headers,
           title=f"pipeline {name}")
