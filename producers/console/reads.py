"""The console's reads, over the control plane's seams (``open_control_plane``), so a
``memory://`` fleet shows too. Each is a read ``batchfleet status``, ``rollout status``,
``dlq list`` or ``bulk list`` already makes: sets, heartbeats, stream lengths and bounded
ranges, never a keyspace scan, so a refresh costs the same at ten keys or a million.

One overview is read at most once per ``cache_s`` whatever the number of open pages:
pages polling together share it (docs/performance.md, "Console").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from batchfleet.connectors.broker import Broker
from batchfleet.connectors.control_plane import ControlPlane
from batchfleet.connectors.fleet import FleetSnapshot
from batchfleet.connectors.output_report import DEFAULT_SINCE_S, read_rows
from batchfleet.producers.bulk.state import JobRecord, list_jobs
from batchfleet.producers.console.views import (
    History,
    error_types,
    letter_json,
    model_rows,
    rollout_json,
    worker_rows,
)
from batchfleet.schemas.errors import UnknownModelError

#: Bulk jobs listed, newest first.
BULK_JOBS = 10
#: Dead letters per page of the newest-first list.
DLQ_PAGE = 20
#: Newest dead letters the overview carries per model that has any.
DLQ_NEWEST = 5


def bulk_json(record: JobRecord) -> dict[str, Any]:
    elapsed = (record.finished_at or record.updated_at) - record.created_at
    return {"job_id": record.job_id, "status": record.display_status,
            "model": record.identity.get("model"), "rows_done": record.rows_done,
            "total": record.total, "failed": record.failed,
            "rows_per_s": round(record.rows_done / elapsed, 1) if elapsed > 0 else None,
            "updated_at": record.updated_at}


def _counts(snap: FleetSnapshot) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for w in snap.workers:
        for model, s in w.model_stats.items():
            done = s.get("succeeded", 0.0) + s.get("failed", 0.0) + s.get("expired", 0.0)
            before = out.get(model, (0.0, 0.0))
            out[model] = (before[0] + done, before[1] + s.get("failed", 0.0))
    return out


class ConsoleReads:
    def __init__(self, plane: ControlPlane, broker: Broker, cache_s: float = 1.0,
                 history: History | None = None) -> None:
        self._plane = plane
        self._fleet = plane.fleet(broker)
        self._cache_s = cache_s
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self.history = history or History()

    async def close(self) -> None:
        await self._fleet.close()

    async def overview(self) -> dict[str, Any]:
        """The whole page's figures; pages asking within ``cache_s`` share one read."""
        async with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < self._cache_s:
                return self._cached[1]
            body = await self._read()
            self._cached = (time.monotonic(), body)
            return body

    async def _read(self) -> dict[str, Any]:
        snap = await self._fleet.read()
        models = model_rows(snap)
        tables = await self._plane.routes.tables([m["model"] for m in models])
        for row in models:
            pause = tables[row["model"]].paused if row["model"] in tables else None
            row["paused"] = None if pause is None else pause.to_wire()
        self.history.add(snap.taken_at, models, _counts(snap))
        rollouts = [r for m in models if (r := await self._rollout(m["model"])) is not None]
        jobs = await list_jobs(self._plane.bulk_jobs, BULK_JOBS)
        fleet = snap.to_json()
        return {"taken_at": snap.taken_at, "namespace": snap.namespace,
                "broker": snap.broker_title, "totals": fleet["totals"],
                "workers": worker_rows(snap), "models": models, "lanes": fleet["lanes"],
                "rollouts": rollouts, "bulk": [bulk_json(j) for j in jobs],
                "outputs": await self.outputs([m["model"] for m in models]),
                "dlq": [await self.dead_letters(m["model"], limit=DLQ_NEWEST)
                        for m in models if m["dlq"]],
                "history": self.history.series()}

    async def outputs(self, models: list[str]) -> dict[str, Any]:
        """Each model's versions with output statistics over the last ``DEFAULT_SINCE_S``:
        the rows ``models outputs --json`` prints (a model with none is left out). Three
        bounded reads per model (``output_report.read_rows``), within the overview's
        cache like the others."""
        found = {}
        for model in models:
            rows = await read_rows(self._plane, model, DEFAULT_SINCE_S)
            if any(r.outputs.count for r in rows):
                found[model] = [r.to_json() for r in rows]
        return {"since_s": DEFAULT_SINCE_S, "models": found}

    async def _rollout(self, model: str) -> dict[str, Any] | None:
        try:
            status = await self._plane.rollouts.status(model)
        except UnknownModelError:
            return None
        return rollout_json(status.to_json())

    async def dead_letters(self, model: str, before: str = "", limit: int = DLQ_PAGE
                           ) -> dict[str, Any]:
        """The newest page of a model's dead letters (one bounded range read)."""
        letters = await self._plane.dead_letters.newest(model, limit, before)
        return {"model": model,
                "error_types": error_types(letters),
                "letters": [letter_json(dl) for dl in letters],
                "next_before": letters[-1].entry_id if len(letters) == limit else None}
