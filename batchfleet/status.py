"""What ``batchfleet status`` shows: the fleet reader's snapshot, as tables.

Tables follow :mod:`batchfleet.output`: cells fold (full worker IDs), the time is
local and human, ``-o wide`` adds columns and ``--no-headers`` leaves plain rows.

The reading is a library function (``connectors.fleet``) so the CLI and the
gateway share it; this module only formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from batchfleet.connectors.fleet import (
    FleetSnapshot,
    LaneView,
    StreamStats,
    WorkerView,
    parse_heartbeat,
    summarize,
)
from batchfleet.output import human_time
from batchfleet.schemas.registry import Pause

__all__ = ["FleetSnapshot", "LaneView", "StreamStats", "WorkerView",
           "lanes_table", "parse_heartbeat", "render", "summarize", "workers_table"]


# --- rendering ------------------------------------------------------------------------


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def _percent(share: float | None, alarm: str) -> Text:
    """A share as a percentage, coloured when above zero; "—" when nothing counted it."""
    if share is None:
        return Text("—")
    return Text(f"{share:.1%}", style=alarm if share > 0 else "")


def _breakers(states: Mapping[str, Mapping[str, int]], workers: int) -> Text:
    bad = [f"{name} {state} {n}/{workers}" for name, counts in sorted(states.items())
           for state, n in sorted(counts.items()) if state != "closed"]
    if not workers:
        return Text("—")
    return Text(", ".join(bad), style="bold red") if bad else Text("closed", style="green")


def _table(title: str | None, columns: Sequence[tuple[str, bool]], *, no_headers: bool,
           caption: str | None = None) -> Table:
    """A table whose cells fold, never cut (an ID copied from it is whole); with
    ``no_headers``, no title, caption, header row or box: plain rows for scripts."""
    table = Table(title=None if no_headers else title, caption=None if no_headers else caption,
                  show_header=not no_headers, box=None if no_headers else box.HEAVY_HEAD)
    for col, right in columns:
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    return table


def lanes_table(snap: FleetSnapshot, *, wide: bool = False, no_headers: bool = False) -> Table:
    """One row per lane; ``wide`` adds the pending (delivered, unacked) count and how many
    shard streams the row adds up (``--lane-shards``). The model-wide cells (req/s of that
    model, mean batch size, error and degraded shares since the workers started, breakers,
    DLQ, workers) are on a model's first row."""
    table = _table(f"batchfleet · {snap.namespace} on {snap.broker_title} · "
                   f"{human_time(snap.taken_at)}",
                   [(col, col not in ("model", "lane", "breakers")) for col in (
                       "model", "lane", *(("shards",) if wide else ()), "depth",
                       *(("pending",) if wide else ()), "lag",
                       "oldest", "req/s", "batch", "err %", "degr %", "p99 ms", "drain",
                       "breakers", "dlq", "workers")],
                   no_headers=no_headers,
                   caption=f"{len(snap.workers)} worker(s) · {snap.throughput_rps:,.1f} req/s "
                           f"· {snap.retry_scheduled} waiting to retry · "
                           f"{snap.undecodable} undecodable")
    previous = None
    for lane in snap.lanes:
        first = lane.model != previous or no_headers  # scripts get every cell on every row
        previous = lane.model
        table.add_row(
            lane.model if first else "", lane.lane, *((str(lane.shards),) if wide else ()),
            Text(_num(lane.depth), style="yellow" if lane.depth else ""),
            *((_num(lane.pending),) if wide else ()), _num(lane.lag),
            _age(lane.oldest_age_s),
            _num(lane.throughput_rps, "{:,.1f}") if first else "",
            _num(lane.mean_batch_size, "{:,.1f}") if first else "",
            _percent(lane.error_rate, "red") if first else "",
            _percent(lane.degraded_rate, "yellow") if first else "",
            _num(lane.p99_ms, "{:,.1f}"), _age(lane.time_to_drain_s),
            _breakers(lane.breakers, lane.workers) if first else "",
            Text(str(lane.dlq), style="red" if lane.dlq else "") if first else "",
            Text(str(lane.workers), style="" if lane.workers else "red") if first else "")
    return table


def cache_cell(counters: Mapping[str, int]) -> str:
    """The result cache's hit ratio (answered without compute, of the cache-enabled
    requests) and the compute it saved; "—" when the worker caches nothing."""
    hits = counters.get("cache_hits", 0) + counters.get("cache_coalesced", 0)
    looked = hits + counters.get("cache_misses", 0)
    if not looked:
        return "—"
    saved_s = counters.get("cache_saved_ms", 0) / 1000.0
    return f"{hits / looked:.0%} · {_age(saved_s)} saved"


def loaded_cell(loaded: tuple[str, ...] | None) -> str:
    """The models a worker holds in memory: "all" unless it loads them on demand
    (docs/models.md, "Loading on demand"), then those loaded now ("—": none)."""
    if loaded is None:
        return "all"
    return ", ".join(loaded) or "—"


def workers_table(snap: FleetSnapshot, *, wide: bool = False,
                  no_headers: bool = False) -> Table:
    """One row per live worker, its full ID first; ``wide`` adds broker and uptime; ``cache``
    is the result cache's hit ratio and saved compute (docs/cache.md); ``loaded`` the models it
    holds in memory (:func:`loaded_cell`)."""
    right = ("buffered", "req/s", "degraded/s", "ok", "failed", "dlq'd", "cache", "seen", "up")
    table = _table("workers", [(col, col in right) for col in (
        "worker", "host", "device", *(("broker",) if wide else ()), "models", "loaded",
        "breakers", "buffered", "req/s", "degraded/s", "ok", "failed", "dlq'd", "cache", "seen",
        *(("up",) if wide else ()))], no_headers=no_headers)
    for w in snap.workers:
        states = {name: {state: 1} for name, state in w.breakers.items()}
        table.add_row(w.worker_id, w.host, w.device, *((w.broker,) if wide else ()),
                      ", ".join(w.models), loaded_cell(w.loaded), _breakers(states, 1),
                      str(w.buffered), f"{w.throughput_rps:,.1f}", f"{w.degraded_rps:,.1f}",
                      f"{w.counters['succeeded']:,}", f"{w.counters['failed']:,}",
                      f"{w.counters['dead_lettered']:,}", cache_cell(w.counters),
                      _age(w.seen_s_ago),
                      *((_age(w.up_s),) if wide else ()))
    return table


def paused_lines(paused: Mapping[str, Pause]) -> list[Text]:
    """One line per model an operator paused (``models pause``, the console): who, when,
    why; its requests wait in its lanes until ``models resume``."""
    return [Text(f"{model}: lanes paused by {p.who} at {human_time(p.at)}"
                 + (f": {p.why}" if p.why else ""), style="bold yellow")
            for model, p in sorted(paused.items())]


def render(snap: FleetSnapshot, *, wide: bool = False, no_headers: bool = False,
           paused: Mapping[str, Pause] | None = None) -> Group:
    """The lanes table, the paused models, then the workers table (omitted while no
    worker is alive)."""
    lanes = lanes_table(snap, wide=wide, no_headers=no_headers)
    notes = [] if no_headers else paused_lines(paused or {})
    if not snap.workers:  # said in words, except to scripts (their rows are the lanes)
        return Group(lanes, *notes, *(() if no_headers else (Text("no live workers",
                                                                  style="bold red"),)))
    return Group(lanes, *notes, workers_table(snap, wide=wide, no_headers=no_headers))
