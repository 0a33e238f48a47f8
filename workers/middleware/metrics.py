"""Prometheus metrics (``workers.metrics.WorkerMetrics``) as middleware, with the sampler
that refreshes the gauges needing a look outside: backlog, DLQ sizes, breakers, memory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog
import torch

from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.names import LANES
from batchfleet.workers.completion import Completed
from batchfleet.workers.guards import Guards
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.models.runtimes import runtime_info
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")


class Metrics(Middleware):
    def __init__(self, metrics: WorkerMetrics, guards: Guards | None,
                 sample_every_s: float) -> None:
        self.metrics = metrics
        self._guards = guards
        self._every_s = sample_every_s
        self._ctx: WorkerContext | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        for model, seconds in warmup_s.items():  # none yet for a model loaded on demand
            self.metrics.model_load.labels(model).set(seconds)
        for model in ctx.handlers:
            self.metrics.up.labels(model).set(1)
        for model, info in runtime_info(ctx.handlers).items():  # docs/runtimes.md
            for stat in ("max_abs", "mean_abs", "relative"):
                if info.get("accuracy"):
                    self.metrics.model_accuracy.labels(model, stat).set(info["accuracy"][stat])

    async def on_stop(self, ctx: WorkerContext) -> None:
        for model in ctx.handlers:
            self.metrics.up.labels(model).set(0)

    def on_paused(self, models: frozenset[str]) -> None:
        self.metrics.on_lanes_paused(models)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        self.metrics.on_batch(batch.key.model, LANES[batch.key.lane_rank], len(batch.jobs),
                              run.compute_s)

    def after_complete(self, done: Completed) -> None:
        self.metrics.on_completed(done, time.time())

    def vitals(self) -> dict[str, Any]:
        return {"lane_pauses": self.metrics.lane_pause_counts(),
                "throughput_rps": round(self.metrics.throughput_rps, 1),
                "model_stats": self._model_stats(),
                "lanes": self.metrics.lanes,
                "runtimes": runtime_info(self._ctx.handlers) if self._ctx else {}}

    def _model_stats(self) -> dict[str, dict[str, float]]:
        """Each model's own rate and counters, with the batch cap its fill is taken against."""
        cap = self._ctx.settings.max_batch_size if self._ctx is not None else None
        return {m: {**v, **({"max_batch_size": cap} if cap else {})}
                for m, v in self.metrics.model_stats().items()}

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._sample_loop()]

    async def _sample_loop(self) -> None:
        assert self._ctx is not None
        ctx, guards = self._ctx, self._guards
        dlq = ctx.plane.dead_letters
        while True:
            try:
                backlog = await ctx.consumer.backlog()
                sizes = {m: await dlq.size(m) for m in ctx.handlers}
                breakers = (guards.model, guards.store) if guards is not None else ()
                self.metrics.sample(backlog, sizes, breakers, ctx.in_flight(),
                                    dict(guards.model.items()) if guards is not None else {})
                device = ctx.compute.device
                if device.type == "cuda":
                    self.metrics.device_memory.labels(str(device)).set(
                        torch.cuda.memory_allocated(device))
            except BatchfleetError as exc:
                log.info("metrics sample skipped", error=str(exc))
            await asyncio.sleep(self._every_s)
