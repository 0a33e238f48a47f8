"""A batch past its compute limit is split here, and the request that hangs is boxed in.

A stall cannot tell the request that hangs from its neighbours, so each request of
the stalled batch is *implicated* once (counted durably, in its result record) and
then re-run alone on the second compute thread (``ComputeThread.run_aside``) while
the main thread serves other batches. Alone, a request either answers or stalls
again; stalling alone after being implicated before (here or on another worker
that died before it could finish this) is ``STALLS_TO_QUARANTINE`` stalls: it is
quarantined (``failed``, dead-lettered as ``stalled``) on this worker, never handed
on to hang another. A request whose stall count already reaches it when its batch
stalls is quarantined straight away, not run alone again (that would cost a limit
more). Containments run one at a time: they share the one aside thread. Once one
request stalled alone, the rest are not run here: they fail retryably and are
retried later, so a model that hangs on everything costs two limits per batch, not
one per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from batchfleet.schemas.errors import BatchfleetError, ComputeTimeoutError, StalledError
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.jobs import Job
from batchfleet.workers.runner import BatchRun

log = structlog.get_logger("batchfleet.worker")

STALLS_TO_QUARANTINE = 2

#: Counts one more stall of each request durably and returns each one's count.
NoteStalls = Callable[[Sequence[str]], Awaitable[list[int]]]


class Containment:
    def __init__(self, compute: ComputeThread, note_stalls: NoteStalls) -> None:
        self._compute = compute
        self._note = note_stalls
        #: Requests quarantined as stalled, since start (the final log line shows it).
        self.quarantined = 0
        #: One containment at a time: they share the one aside thread, and a request
        #: queued there behind another's hang must not be charged for it.
        self._one = asyncio.Lock()

    async def contain(self, lane: str, jobs: Sequence[Job], stalled: BatchRun) -> BatchRun:
        """The stalled batch's outcome after splitting it into single requests."""
        async with self._one:
            return await self._contain(lane, jobs, stalled)

    async def _contain(self, lane: str, jobs: Sequence[Job], stalled: BatchRun) -> BatchRun:
        counts = await self._note([j.request.request_id for j in jobs])
        outputs: list[Tensors | BatchfleetError] = list(stalled.outputs)
        compute_s, forwards, pinned = stalled.compute_s, stalled.forwards, False
        for i, (job, count) in enumerate(zip(jobs, counts, strict=True)):
            if pinned:
                outputs[i] = ComputeTimeoutError(
                    "not run: it shared a batch past its compute limit with a request that "
                    "stalled again alone; retried")
                continue
            if count >= STALLS_TO_QUARANTINE:  # implicated before: not worth a limit more
                outputs[i] = self._quarantine(lane, job, count)
                continue
            alone = await self._compute.run_aside(lane, [job])
            compute_s, forwards = compute_s + alone.compute_s, forwards + alone.forwards
            if alone.stalled:
                (again,) = await self._note([job.request.request_id])
                pinned = True
                outputs[i] = (self._quarantine(lane, job, again)
                              if again >= STALLS_TO_QUARANTINE else alone.outputs[0])
            else:
                outputs[i] = alone.outputs[0]
        return BatchRun(outputs, stalled.started_at, compute_s, forwards, stalled=True)

    def _quarantine(self, lane: str, job: Job, count: int) -> StalledError:
        self.quarantined += 1
        limit = self._compute.limits.limit_s(lane)
        log.error("request quarantined: it stalls compute", request_id=job.request.request_id,
                  model=lane, stalls=count, limit_s=round(limit, 3))
        return StalledError(f"stalled compute {count} times (past the {limit:g}s limit), the "
                            "last time running alone; quarantined instead of retried")
