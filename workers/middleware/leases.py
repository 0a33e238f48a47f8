"""In-flight leases (``workers.leases``) as middleware: hold every delivery from fetch to
ack, skip a second copy of one already held, refresh them on the side."""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.broker import Delivery
from batchfleet.workers.leases import Leases, lease_interval_s
from batchfleet.workers.middleware.base import Middleware

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext


class LeaseKeeper(Middleware):
    def __init__(self, claim_idle_ms: int) -> None:
        self._interval_s = lease_interval_s(claim_idle_ms)
        self.leases: Leases | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self.leases = Leases(ctx.consumer, self._interval_s)

    def after_fetch(self, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        assert self.leases is not None
        # held until acked; a copy of an entry already held is this worker's own (its
        # reclaim, or a Kafka re-fetch): it is being worked on, never take it twice
        return self.leases.hold(deliveries)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        if self.leases is not None:
            self.leases.release(deliveries)

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        assert self.leases is not None
        return [self.leases.run()]
