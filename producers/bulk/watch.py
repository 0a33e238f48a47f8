"""Noticing that no worker serves the job's model, and saying so once.

A declared model accepts submits before any worker exists (its rows wait safely in
the lane), so a job can run with nothing to score it. Rather than a "rows_done 0"
line every 10 s forever, the job looks at the live-worker heartbeats (two round
trips, whatever the keyspace holds) when it starts and whenever no row has finished
for a while; it says once that it is waiting, shows that state in its progress, and
says once more when a worker turns up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from batchfleet.producers.bulk.progress import ProgressReporter
from batchfleet.schemas.heartbeat import HeartbeatRecord

log = structlog.get_logger("batchfleet.bulk")

#: No row finished for this long: look at the heartbeats (and at most this often).
QUIET_S = 5.0


def serves(records: Sequence[HeartbeatRecord], model: str) -> bool:
    """Whether a live worker serves ``model`` (under any version label)."""
    return any(m.split("@", 1)[0] == model for r in records for m in r.models)


class WorkerWatch:
    def __init__(self, read_live: Callable[[], Awaitable[Sequence[HeartbeatRecord]]],
                 job_id: str, model: str, progress: ProgressReporter,
                 quiet_s: float = QUIET_S) -> None:
        self._read_live, self._job_id, self._model = read_live, job_id, model
        self._progress, self._quiet_s = progress, quiet_s
        self._rows = -1
        self._moved_at = self._looked_at = time.monotonic()
        self.waiting = False

    @property
    def reason(self) -> str:
        return f"waiting for a worker: none serves {self._model!r}; rows wait in its lane"

    async def tick(self, rows: int) -> None:
        """Called at each checkpoint with the rows done so far."""
        now = time.monotonic()
        first = self._rows < 0
        if rows != self._rows:
            self._rows, self._moved_at = rows, now
            if not first and not self.waiting:
                return
        quiet = now - self._moved_at >= self._quiet_s and now - self._looked_at >= self._quiet_s
        if not (first or quiet or self.waiting):
            return
        if self.waiting and not first and now - self._looked_at < 1.0:
            return  # while waiting, look about once a second, so scoring resumes visibly
        self._looked_at = now
        served = serves(await self._read_live(), self._model)
        if not served and not self.waiting:
            self.waiting = True
            log.warning("bulk job waiting: no live worker serves the model; its rows wait in "
                        "the lane until one starts", job_id=self._job_id, model=self._model)
            self._progress.waiting(self.reason)
        elif served and self.waiting:
            self.waiting = False
            log.info("a worker serves the model now; scoring", job_id=self._job_id,
                     model=self._model)
            self._progress.waiting(None)
