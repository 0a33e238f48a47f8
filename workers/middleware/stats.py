"""Counting what the worker did (``workers.stats.WorkerStats``) as middleware."""

from __future__ import annotations

from typing import Any

from batchfleet.workers.completion import Completed
from batchfleet.workers.intake import Intake
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.stats import WorkerStats


class Stats(Middleware):
    def __init__(self, stats: WorkerStats | None = None) -> None:
        self.stats = stats or WorkerStats()

    async def after_decode(self, intake: Intake) -> None:
        self.stats.undecodable += len(intake.undecodable)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        self.stats.batches += 1
        self.stats.computed += len(batch.jobs)

    def after_complete(self, done: Completed) -> None:
        self.stats.count(done)

    def vitals(self) -> dict[str, Any]:
        return {k: getattr(self.stats, k) for k in WorkerStats.__dataclass_fields__}
