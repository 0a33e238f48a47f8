"""A record each live worker refreshes with its vital signs; its TTL buries dead workers.

The demo and tests wait for it to know a worker is warmed up; operators read
it to see who is serving what, with which breaker states and counters.

Each beat also puts back what Redis may have lost with its data (restarted
without persistence, flushed, keys evicted): the heartbeat key itself, the
worker's models in the model registry (so ``submit`` keeps knowing them), and
the lane losses the consumer noted while recreating its groups (so waiters of
the requests lost with them stop waiting). Each loss is logged once.

Where and how the record is kept is the ``Heartbeats`` seam's business
(``connectors.heartbeats``); its layout is ``schemas.heartbeat``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from batchfleet.connectors.control_plane import Heartbeats, StoreResults
from batchfleet.connectors.model_registry import ServedModels
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.heartbeat import BEAT_EVERY_S

log = structlog.get_logger("batchfleet.heartbeat")

EVERY_S = BEAT_EVERY_S  # readers judge liveness by it (``schemas.heartbeat.LIVE_WITHIN_S``)
TTL_S = 10


class Heartbeat:
    def __init__(
        self, heartbeats: Heartbeats, worker_id: str, vitals: Callable[[], dict[str, Any]], *,
        store: StoreResults | None = None, served: ServedModels | None = None,
        lane_losses: dict[str, int] | None = None,
    ) -> None:
        self._heartbeats = heartbeats
        self._worker_id = worker_id
        self._vitals = vitals
        self._started = time.time()
        self._store = store
        #: This worker's part of the model registry, re-asserted with every beat.
        self._served = served
        #: The consumer's own dict: entries are removed once recorded in the store.
        self._lane_losses = lane_losses
        self._beats = 0

    async def beat(self) -> None:
        info = {"host": socket.gethostname(), "started_at": self._started,
                "seen_at": time.time(), **self._vitals()}
        was_there = await self._heartbeats.write(self._worker_id, info, TTL_S)
        if not was_there and self._beats > 0:
            log.warning("heartbeat was gone (Redis lost its data?); recreated it",
                        worker=self._worker_id)
        self._beats += 1
        await self.reassert()

    async def reassert(self) -> None:
        """Re-register the models and record pending lane losses (both idempotent)."""
        if self._served is not None and await self._served.assert_served():
            log.warning("model registry had lost this worker's models; registered them again",
                        models=sorted(self._served.versions))
        if self._store is None:
            return
        if self._lane_losses:
            losses = dict(self._lane_losses)
            await self._store.mark_lane_losses(losses)
            for lane, ms in losses.items():
                if self._lane_losses.get(lane) == ms:
                    del self._lane_losses[lane]

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except BatchfleetError as exc:  # advisory: must not stop the worker
                log.warning("heartbeat failed", error=str(exc))
            await asyncio.sleep(EVERY_S)

    async def forget(self) -> None:
        try:
            await self._heartbeats.forget(self._worker_id)
            if self._served is not None:  # else its served entries just stop being live
                await self._served.withdraw()
        except BatchfleetError as exc:  # the record expires on its own
            log.info("could not remove heartbeat", error=str(exc))
