"""``batchfleet status``: a live view of every lane, or JSON/YAML snapshots for scripts."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.control_plane import FleetReads, Routes
from batchfleet.connectors.fleet_paused import fleet_document, paused_models
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, error_line, fail
from batchfleet.output import NoHeadersOpt, OutputOpt, console, dump, iso_times, output_format
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import Pause
from batchfleet.schemas.settings import DEFAULT_NAMESPACE
from batchfleet.status import FleetSnapshot, render

#: A snapshot that takes longer than this counts as failed (an unreachable Redis).
READ_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Seen:
    """One refresh: the fleet snapshot and the models an operator paused."""

    snap: FleetSnapshot
    paused: dict[str, Pause]


async def _read(reader: FleetReads, routes: Routes) -> Seen:
    async def both() -> Seen:
        snap = await reader.read()
        return Seen(snap, await paused_models(routes, snap))

    return await bounded(both(), READ_TIMEOUT_S)


def _show(seen: Seen, output: str, no_headers: bool) -> None:
    """One snapshot: ``to_json()`` (the gateway's ``/v1/fleet`` document) with its times
    as ISO 8601 UTC, and ``paused`` (model -> who, when, why), as JSON or YAML; else the
    tables."""
    if output in ("json", "yaml"):
        dump(iso_times(fleet_document(seen.snap, seen.paused)), output)
    else:
        console().print(render(seen.snap, wide=output == "wide", no_headers=no_headers,
                               paused=seen.paused))


async def _watch(reader: FleetReads, routes: Routes, output: str, no_headers: bool,
                 interval: float) -> None:
    """Refresh until interrupted; a failed read is shown and retried, never fatal."""
    if output in ("json", "yaml"):  # one document per snapshot: JSON lines, YAML "---"
        while True:
            if output == "yaml":
                typer.echo("---")
            try:
                _show(await _read(reader, routes), output, no_headers)
            except (BatchfleetError, OSError, TimeoutError) as exc:
                dump({"error": str(exc) or type(exc).__name__}, output)
            await asyncio.sleep(interval)
    with Live(Text("reading the fleet..."), auto_refresh=False, console=Console()) as live:
        while True:
            try:
                seen = await _read(reader, routes)
                live.update(render(seen.snap, wide=output == "wide", no_headers=no_headers,
                                   paused=seen.paused), refresh=True)
            except (BatchfleetError, OSError, TimeoutError) as exc:
                live.update(Text(f"cannot read the fleet: {exc or type(exc).__name__}",
                                 style="bold red"), refresh=True)
            await asyncio.sleep(interval)


def status(
    broker: BrokerOpt,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    as_json: JsonOpt = False,
    output: OutputOpt = "table",
    no_headers: NoHeadersOpt = False,
    watch: Annotated[bool | None, typer.Option(
        "--watch/--once",
        help="Refresh until Ctrl-C, or print one snapshot. Default: watch on a terminal, "
             "once otherwise (and with -o json|yaml).")] = None,
    interval: Annotated[float, typer.Option(
        min=0.2, help="Seconds between refreshes with --watch.")] = 2.0,
) -> None:
    """Show every model's lanes: depth, lag, oldest request, the model's own req/s, mean
    batch size, error and degraded shares, p99, breakers, DLQ size and the live workers;
    and the models whose lanes an operator paused (`models pause`), with who and why.

    Depth comes straight from Redis when Redis is the broker; with Kafka it is the lag
    the live workers report for their partitions. Workers are the ones whose heartbeat
    is fresh (they refresh it every 2 s; it expires after 10 s).

    Examples:

        batchfleet status --broker redis://localhost:6379/0

        batchfleet status --broker kafka://kafka:9092 --results redis://redis:6379/0 --interval 5

        batchfleet status --json | jq '.lanes[] | select(.depth > 0)'

        batchfleet status -o wide --no-headers --once | grep demo-mlp

        batchfleet status --json --watch --interval 10 >> fleet.ndjson
    """
    from batchfleet.options import open_doors
    from batchfleet.schemas.errors import ConfigError

    try:
        plane, door = open_doors(broker, results, namespace)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    output = output_format(output, as_json)
    structured = output in ("json", "yaml")
    live = watch if watch is not None else (not structured and sys.stdout.isatty())

    async def go() -> None:
        reader = plane.fleet(door)
        try:
            if live:
                await _watch(reader, plane.routes, output, no_headers, interval)
            else:
                _show(await _read(reader, plane.routes), output, no_headers)
        finally:
            await reader.close()
            await plane.close()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        return
    except (BatchfleetError, OSError, TimeoutError) as exc:
        message, code = error_line(exc)
        raise fail(f"cannot read the fleet: {message}", code) from exc
