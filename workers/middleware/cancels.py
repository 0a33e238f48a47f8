"""Cancelled requests dropped unrun, right before their batch computes.

A cancel (``connectors.request_control``) writes the terminal ``cancelled`` result
first, then adds the ID to the cancel set. This middleware keeps the set's size,
read once a second on the side; while it is zero (the usual case) a batch costs
nothing extra. Only while it is non-empty is each batch's IDs checked and the
cancelled ones taken out of the set, in one round trip, and their deliveries
acked without a result (theirs is already stored). Checking just before compute,
not at fetch, also catches requests cancelled while they waited in the batcher. It
runs before the breakers (``defaults.py``): a batch dropped whole must not have taken
a half-open breaker's one probe. A batch held behind an open breaker is not looked at
again when it resumes, and a cancel a worker has not seen yet (up to a second old):
those run, and their write loses to ``cancelled``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.control_plane import Cancels
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.workers.middleware.base import Batch, Middleware

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

#: How stale the cached size of the cancel set may be.
REFRESH_S = 1.0


class CancelledDrop(Middleware):
    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self._refresh_s = refresh_s
        self._set: Cancels | None = None
        self._ctx: WorkerContext | None = None
        #: The set's size at the last look; assumed non-empty until then.
        self._size = 1
        self.dropped = 0

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._set = ctx.plane.cancels

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        await self._look()

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._watch()]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self._look()

    async def _look(self) -> None:
        assert self._set is not None
        try:
            self._size = await self._set.size()
        except ResultStoreError as exc:  # keep the last size; the next look may work
            log.warning("cannot read the cancel set", error=str(exc))

    async def before_compute(self, batch: Batch) -> bool:
        """False once every job was cancelled: the batch is done (acked), never run."""
        if self._size == 0:
            return True
        assert self._set is not None and self._ctx is not None
        try:
            taken = await self._set.take([job.request.request_id for job in batch.jobs])
        except ResultStoreError as exc:
            # unknown: run it; if it was cancelled, its write loses to the stored result
            log.warning("cannot check for cancelled requests; computing", error=str(exc))
            return True
        if not taken:
            return True
        dropped = [job for job in batch.jobs if job.request.request_id in taken]
        batch.jobs = [job for job in batch.jobs if job.request.request_id not in taken]
        await self._ctx.ack([job.delivery for job in dropped])
        self.dropped += len(dropped)
        log.info("cancelled requests dropped unrun", count=len(dropped), model=batch.key.model)
        return bool(batch.jobs)

    def vitals(self) -> dict[str, Any]:
        return {"cancelled": self.dropped}
