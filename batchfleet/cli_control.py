"""``batchfleet cancel``, ``batchfleet lane purge`` and ``batchfleet check``.

The work is in ``connectors.request_control`` (cancel, purge) and ``connectors.fleet``
(the snapshot ``check`` judges); :func:`fleet_problems` is the pure judgement.

Output (:mod:`batchfleet.output`): these report actions, so ``-o table`` (the default)
is one plain line per request, lane or problem, which people read and runbooks grep;
``-o wide`` is the same as a table with every field (cells fold, IDs stay whole),
``--no-headers`` drops its header; ``-o json`` (``--json``) and ``-o yaml`` carry
every field, JSON one document per line as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, TypeVar

import typer

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.fleet import FleetSnapshot
from batchfleet.options import (
    BrokerOpt,
    JsonOpt,
    NamespaceOpt,
    ResultsOpt,
    error_line,
    fail,
    handled,
    open_doors,
)
from batchfleet.output import Column, NoHeadersOpt, OutputOpt, dump, output_format, render
from batchfleet.schemas.settings import DEFAULT_NAMESPACE

T = TypeVar("T")

#: ``check``'s exit codes (docs/operations.md): a fleet it cannot read is unhealthy too.
HEALTHY, UNHEALTHY, USAGE = 0, 1, 2
#: ``cancel``'s exit codes: every ID cancelled, an error, some not cancelled, some unknown.
CANCELLED, ERROR, NOT_CANCELLED, UNKNOWN = 0, 1, 3, 4
#: A snapshot that takes longer than this counts as unreachable.
READ_TIMEOUT_S = 10.0


def _run(body: Callable[[], Coroutine[Any, Any, T]], code: int = ERROR) -> T:
    """Run a coroutine; the project's errors (the store or broker down, Kafka asked to
    purge) are one line (``options.error_line``) and ``code`` (2 for a config error)."""
    try:
        return asyncio.run(body())
    except Exception as exc:
        if not handled(exc):
            raise
        line, usual = error_line(exc)
        raise fail(line, USAGE if usual == USAGE else code) from exc


def _report(rows: Sequence[dict[str, Any]], lines: Sequence[str], columns: Sequence[Column],
            output: str, no_headers: bool) -> None:
    """Action results: plain lines (table), a folded table (wide), JSON lines or YAML."""
    if output == "json":
        for row in rows:
            typer.echo(json.dumps(row))
    elif output == "table":
        for line in lines:
            typer.echo(line)
    else:
        render(rows, columns, output, no_headers)


CANCEL_COLUMNS = (Column("request_id"), Column("outcome"), Column("status"),
                  Column("message"))
PURGE_COLUMNS = (Column("model"), Column("lane"), Column("cancelled"),
                 Column("held", "held (finishing)"), Column("dropped", "already finished"),
                 Column("undecodable"))
PROBLEM_COLUMNS = (Column("kind"), Column("model"), Column("lane"), Column("message"))


# --- cancel ------------------------------------------------------------------------------


def cancel(
    request_ids: Annotated[list[str], typer.Argument(help="Request IDs to cancel.")],
    broker: BrokerOpt,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    as_json: JsonOpt = False,
    output: OutputOpt = "table",
    no_headers: NoHeadersOpt = False,
) -> None:
    """Cancel queued requests: each gets the terminal status `cancelled` and is never
    computed. One a worker already holds finishes, and the line says so.

    Exit code: 0 every ID cancelled, 1 error, 3 some already running or finished, 4 some
    unknown.

    Examples:

        batchfleet cancel 3f2a9c... 77b1d0... --broker redis://localhost:6379/0

        batchfleet cancel 3f2a9c... --json

        batchfleet cancel 3f2a9c... 77b1d0... -o wide
    """
    from batchfleet.connectors.request_control import CancelReport

    async def go() -> list[CancelReport]:
        plane, door = open_doors(broker, results, namespace)
        control = plane.request_control(door)
        try:
            return await control.cancel(request_ids)
        finally:
            await control.close()
            await plane.close()

    output = output_format(output, as_json)
    reports = _run(go)
    _report([asdict(r) | ({"message": r.message} if output == "wide" else {})
             for r in reports], [f"{r.request_id}: {r.message}" for r in reports],
            CANCEL_COLUMNS, output, no_headers)
    outcomes = {r.outcome for r in reports}
    raise typer.Exit(UNKNOWN if "unknown" in outcomes else
                     CANCELLED if outcomes == {"cancelled"} else NOT_CANCELLED)


# --- lane purge --------------------------------------------------------------------------

lane_app = typer.Typer(help="Operate on a model's priority lanes (queues).\n\nExamples:\n\n"
                       "    batchfleet lane purge demo-mlp --lane bulk --yes",
                       no_args_is_help=True, rich_markup_mode="markdown")


@lane_app.command()
def purge(
    model: Annotated[str, typer.Argument(help="The model whose lane to empty.")],
    broker: BrokerOpt,
    results: ResultsOpt = None,
    lane: Annotated[str | None, typer.Option(
        "--lane", "-l", help="interactive or bulk (default: both).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    as_json: JsonOpt = False,
    output: OutputOpt = "table",
    no_headers: NoHeadersOpt = False,
) -> None:
    """Empty a lane: every queued request gets the terminal status `cancelled` (its
    waiters end at once), then its entry is deleted. Requests a worker already holds
    finish. Entries without a readable request ID go to the undecodable DLQ.
    Redis Streams only: Kafka cannot delete records (exit 2).

    Examples:

        batchfleet lane purge demo-mlp --lane bulk --yes

        batchfleet lane purge demo-mlp --yes --json

        batchfleet lane purge demo-mlp --yes -o wide
    """
    from batchfleet.connectors import BrokerURL
    from batchfleet.connectors.control_plane import RequestControl
    from batchfleet.connectors.request_control import PurgeReport
    from batchfleet.schemas.errors import BatchfleetError
    from batchfleet.schemas.names import LANES, check_lane, check_model_name
    from batchfleet.schemas.registry import UnregisteredModelError

    output = output_format(output, as_json)
    try:
        check_model_name(model)
        lanes = [check_lane(lane)] if lane is not None else list(LANES)
        parsed = BrokerURL.parse(broker)
    except BatchfleetError as exc:
        raise fail(str(exc), USAGE) from exc
    if parsed.kind != "redis":
        raise fail("lane purge needs Redis Streams: Kafka cannot delete records from a "
                   "topic (cancel request IDs instead: batchfleet cancel)", USAGE)
    async def with_control(body: Callable[[RequestControl], Coroutine[Any, Any, T]]) -> T:
        plane, door = open_doors(broker, results, namespace)
        control = plane.request_control(door)
        try:
            known = await plane.models.names()
            if model not in known and not any(
                    (await control.lane_depths(model, lanes)).values()):
                # a typo must not look like an empty lane purged
                raise fail(UnregisteredModelError(model, known).advice("cli"))  # refused: 2
            return await body(control)
        finally:
            await control.close()
            await plane.close()

    if not yes:  # read first: the question says how many, and a dead Redis fails here
        depths = _run(lambda: with_control(lambda c: c.lane_depths(model, lanes)))
        typer.confirm("Cancel every queued request on " + ", ".join(
            f"{model}/{ln} ({n})" for ln, n in depths.items()) + "?", abort=True)

    async def purge_all(control: RequestControl) -> list[tuple[str, PurgeReport]]:
        return [(ln, await control.purge_lane(model, ln)) for ln in lanes]

    purged = _run(lambda: with_control(purge_all))
    _report([{"model": model, "lane": ln, "cancelled": len(report.cancelled),
              "held": report.held, "dropped": report.dropped,
              "undecodable": report.undecodable} for ln, report in purged],
            [f"{model}/{ln}: cancelled {len(report.cancelled)}, left to finish {report.held} "
             f"(held by workers), already finished {report.dropped}, undecodable "
             f"{report.undecodable}" for ln, report in purged],
            PURGE_COLUMNS, output, no_headers)


# --- check -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # no_worker | stalled | breaker_open | compute_stuck
    model: str
    lane: str | None
    message: str


def fleet_problems(snap: FleetSnapshot, stalled_after_s: float,
                   models: Sequence[str] = ()) -> list[Problem]:
    """What ``check`` reports: a model with no live worker, a lane whose oldest request is
    older than ``stalled_after_s`` while nothing finishes (no throughput), an open breaker,
    a worker's compute thread stuck past its limit. ``models`` limits it to those (every
    known model when empty). Pure."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for lane in snap.lanes:
        if models and lane.model not in models:
            continue
        first = lane.model not in seen
        seen.add(lane.model)
        if first and lane.workers == 0:
            problems.append(Problem("no_worker", lane.model, None,
                                    f"{lane.model}: no live worker serves it"))
        if first:
            for name, states in sorted(lane.breakers.items()):
                if states.get("open"):
                    problems.append(Problem(
                        "breaker_open", lane.model, None,
                        f"{lane.model}: breaker {name} open on {states['open']} of "
                        f"{lane.workers} worker(s)"))
        age = lane.oldest_age_s
        if lane.depth and age is not None and age > stalled_after_s \
                and not lane.throughput_rps:
            problems.append(Problem(
                "stalled", lane.model, lane.lane,
                f"{lane.model}/{lane.lane}: stalled, {lane.depth} queued, oldest "
                f"{age:,.0f}s old and nothing finishing"))
    for w in snap.workers:
        for name, stuck_s in sorted(w.stuck_compute.items()):
            if not models or name in models:
                problems.append(Problem(
                    "compute_stuck", name, None,
                    f"{name}: compute stuck for {stuck_s:,.0f}s past its limit on worker "
                    f"{w.worker_id} (not fetching it there)"))
    for model in models:
        if model not in seen:
            problems.append(Problem("no_worker", model, None,
                                    f"{model}: unknown model, no live worker serves it"))
    return problems


def check(
    broker: BrokerOpt,
    results: ResultsOpt = None,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="Only these models (repeatable; default: every known one).")]
    = None,
    stalled_after_s: Annotated[float, typer.Option(
        min=0.0, help="A lane is stalled when its oldest request is older than this and "
                      "nothing finishes.")] = 300.0,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    as_json: JsonOpt = False,
    output: OutputOpt = "table",
    no_headers: NoHeadersOpt = False,
) -> None:
    """Health check for probes and cron: exit non-zero when a model has no live worker, a
    lane is stalled, a breaker is open, or a worker's compute thread is stuck. One line
    per problem.

    Exit code: 0 healthy, 1 problems found or the fleet cannot be read, 2 bad usage.

    Examples:

        batchfleet check --broker redis://localhost:6379/0

        batchfleet check -m demo-mlp --stalled-after-s 120 --json

        batchfleet check -o wide --no-headers
    """
    from batchfleet.schemas.errors import ConfigError

    output = output_format(output, as_json)
    try:
        plane, door = open_doors(broker, results, namespace)
    except ConfigError as exc:
        raise fail(str(exc), USAGE) from exc

    async def go() -> FleetSnapshot:
        reader = plane.fleet(door)
        try:
            return await bounded(reader.read(), READ_TIMEOUT_S)
        finally:
            await reader.close()
            await plane.close()

    problems = fleet_problems(_run(go, UNHEALTHY), stalled_after_s, model or ())
    if output in ("json", "yaml"):
        dump({"healthy": not problems, "problems": [asdict(p) for p in problems]}, output)
    elif output == "wide":
        render([asdict(p) for p in problems], PROBLEM_COLUMNS, output, no_headers,
               title=f"{len(problems)} problem(s)" if problems else "healthy")
    else:
        for p in problems:
            typer.echo(p.message)
        if not problems:
            typer.echo("healthy")
    raise typer.Exit(UNHEALTHY if problems else HEALTHY)
