"""In-flight leases: what this worker holds is never reclaimed from it while it lives.

Redis reclaims an entry (``XAUTOCLAIM``) once it has sat unacked for
``claim_idle_ms``, which is meant for consumers that died. A live worker can
hold entries longer than that without being dead: buffered behind an open
breaker, computing a slow batch, or waiting on a store that is down. So the
worker tracks every delivery from the moment it accepts it until it is acked
(or dropped at shutdown), and :meth:`Leases.run` refreshes their idle time at a
third of ``claim_idle_ms``; only a dead worker's entries (or one whose event loop
is blocked) go idle.

The same set stops a worker from taking its own entries twice: a delivery whose
token it already holds (its own reclaim, or a Kafka re-fetch after a
rebalance) is skipped at intake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

from batchfleet.connectors.broker import Consumer, Delivery
from batchfleet.schemas.errors import BatchfleetError

log = structlog.get_logger("batchfleet.leases")


class Leases:
    """The deliveries this worker holds, by transport token."""

    def __init__(self, consumer: Consumer, interval_s: float) -> None:
        self._consumer = consumer
        self._interval_s = interval_s
        self._held: dict[Any, Delivery] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, deliveries: Iterable[Delivery]) -> list[Delivery]:
        """Start holding deliveries; returns the new ones, leaving out any whose token is
        already held (a second copy of an entry this worker is already working on)."""
        fresh: list[Delivery] = []
        for d in deliveries:
            if d.token in self._held:
                continue
            self._held[d.token] = d
            fresh.append(d)
        return fresh

    def release(self, deliveries: Iterable[Delivery]) -> None:
        """Stop holding deliveries: acked, or left for redelivery."""
        for d in deliveries:
            self._held.pop(d.token, None)

    def held(self) -> list[Delivery]:
        return list(self._held.values())

    async def refresh(self) -> None:
        """Reset the idle time of everything held, in one round trip per call."""
        if self._held:
            await self._consumer.keep_alive(self.held())

    async def run(self) -> None:
        """Refresh until cancelled, draining included. A failed refresh is retried at the
        next tick: a lease needs one success per ``claim_idle_ms`` and gets three tries.

        Leases are kept while a batch computes, however long: every batch has a compute
        limit (``workers.compute_limits``), past which this worker splits it and answers,
        retries or quarantines its requests itself. Letting the leases lapse instead would
        hand a hanging request to the next worker, to hang it too.
        """
        while True:
            try:
                await self.refresh()
            except BatchfleetError as exc:
                log.warning("lease refresh failed; retrying", error=str(exc),
                            held=len(self._held))
            await asyncio.sleep(self._interval_s)


def lease_interval_s(claim_idle_ms: int) -> float:
    """A third of the idle time after which others may reclaim: two misses still hold."""
    return max(0.01, claim_idle_ms / 3000.0)
