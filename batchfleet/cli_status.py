"""``batchfleet status``: a live view of every lane, or JSON snapshots for scripts."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer
from redis.exceptions import RedisError
from rich.console import Console
from rich.live import Live
from rich.text import Text

from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail
from batchfleet.status import FleetReader, FleetSnapshot, render

#: A snapshot that takes longer than this counts as failed (an unreachable Redis).
READ_TIMEOUT_S = 10.0
#: Columns of the tables when the output is not a terminal.
WIDE = 150


async def _read(reader: FleetReader) -> FleetSnapshot:
    return await asyncio.wait_for(reader.read(), READ_TIMEOUT_S)


async def _once(reader: FleetReader, as_json: bool) -> None:
    snap = await _read(reader)
    if as_json:
        typer.echo(json.dumps(snap.to_json()))
        return
    console = Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for every column
        console = Console(width=max(console.width, WIDE))
    console.print(render(snap))


async def _watch(reader: FleetReader, as_json: bool, interval: float) -> None:
    """Refresh until interrupted; a failed read is shown and retried, never fatal."""
    if as_json:  # one JSON document per line
        while True:
            try:
                typer.echo(json.dumps((await _read(reader)).to_json()))
            except (RedisError, OSError, TimeoutError) as exc:
                typer.echo(json.dumps({"error": str(exc) or type(exc).__name__}))
            await asyncio.sleep(interval)
    with Live(Text("reading the fleet..."), auto_refresh=False, console=Console()) as live:
        while True:
            try:
                live.update(render(await _read(reader)), refresh=True)
            except (RedisError, OSError, TimeoutError) as exc:
                live.update(Text(f"cannot read the fleet: {exc or type(exc).__name__}",
                                 style="bold red"), refresh=True)
            await asyncio.sleep(interval)


def status(
    broker: BrokerOpt,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = "bf",
    as_json: JsonOpt = False,
    watch: Annotated[bool | None, typer.Option(
        "--watch/--once",
        help="Refresh until Ctrl-C, or print one snapshot. Default: watch on a terminal, "
             "once otherwise (and with --json).")] = None,
    interval: Annotated[float, typer.Option(
        min=0.2, help="Seconds between refreshes with --watch.")] = 2.0,
) -> None:
    """Show every model's lanes: depth, lag, oldest request, throughput, p99, breakers, DLQ
    size and the live workers.

    Depth comes straight from Redis when Redis is the broker; with Kafka it is the lag
    the live workers report for their partitions. Workers are the ones whose heartbeat
    is fresh (they refresh it every 2 s; it expires after 10 s).

    Examples:

        batchfleet status --broker redis://localhost:6379/0

        batchfleet status --broker kafka://kafka:9092 --results redis://redis:6379/0 --interval 5

        batchfleet status --json | jq '.lanes[] | select(.depth > 0)'

        batchfleet status --json --watch --interval 10 >> fleet.ndjson
    """
    from connectors import BrokerURL
    from connectors.urls import results_url_for
    from schemas.errors import ConfigError
    from schemas.names import Names

    try:
        parsed = BrokerURL.parse(broker)
        results_url = results_url_for(parsed, results)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    live = watch if watch is not None else (not as_json and sys.stdout.isatty())

    async def go() -> None:
        reader = FleetReader(parsed, results_url, Names(namespace))
        try:
            await (_watch(reader, as_json, interval) if live else _once(reader, as_json))
        finally:
            await reader.close()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        return
    except (RedisError, OSError, TimeoutError) as exc:
        raise fail(f"cannot read the fleet: {exc or type(exc).__name__}", 1) from exc
