"""Per-model and result-store circuit breakers (``workers.guards``) as middleware.

An open model breaker pauses only that model's lanes and holds its fetched
batches until a probe is allowed; the store breaker pauses every lane.
"""

from __future__ import annotations

from typing import Any

from batchfleet.workers.guards import Guards
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.runner import BatchRun


class Breakers(Middleware):
    def __init__(self, guards: Guards) -> None:
        self.guards = guards

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return self.guards.paused_models()

    def pause_s(self) -> float:
        return self.guards.pause_s()

    async def before_compute(self, batch: Batch) -> bool:
        if self.guards.allow(batch.key.model):
            return True
        self.guards.hold(batch.key.model, batch)  # its breaker is open: others go on
        return False

    async def on_dropped(self, batch: Batch) -> None:
        # it was allowed (half-open: it took the one probe) and will not run: free the probe
        self.guards.model[batch.key.model].record_neutral()

    def take_held(self) -> Batch | None:
        return self.guards.take_held()  # taking it took the breaker's probe permission

    def held_wait_s(self) -> float | None:
        return self.guards.held_wait_s()

    def held(self) -> dict[str, int]:
        return self.guards.held()

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        # a suspect failing alone says little about the model's health
        self.guards.record_batch(batch.key.model, run,
                                 [j.request.request_id for j in batch.jobs],
                                 telling=batch.key.solo_request_id is None)

    def on_store(self, ok: bool) -> None:
        self.guards.record_store(ok)

    def readiness(self) -> dict[str, bool]:
        return {"breakers_closed": not self.guards.fetch_paused()}

    def vitals(self) -> dict[str, Any]:
        return {"breakers": self.guards.states(), "model_breakers": self.guards.model_states()}
