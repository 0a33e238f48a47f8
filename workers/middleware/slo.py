"""SLO-driven batch closing (``--latency-slo-ms``) as middleware, and the batcher's policy.

:class:`SloBatching` keeps one :class:`~batchfleet.workers.slo.SloController` per model
version that has an SLO and feeds it: arrivals from ``after_decode`` (once per fetch),
compute cost and lateness from ``after_compute`` (once per batch). The batcher asks it
``due_at`` per group instead of the fixed ``max_wait_ms`` (its ``close_policy`` hook);
models without an SLO keep the fixed wait. Without any SLO configured it is not in
the chain at all, and the batcher runs exactly as before. See docs/batching.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batchfleet.workers.batching import ClosePolicy
from batchfleet.workers.intake import Intake
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, BatchKey, Middleware
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.slo import SloConfig, SloController

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext


def has_slo(slo_ms: PerModel[float | None]) -> bool:
    """Whether any model (or version) has an SLO."""
    return slo_ms.default is not None or any(v is not None for _, v in slo_ms.overrides)


class SloBatching(Middleware):
    """Learns each SLO model's compute cost, arrival rate and lateness; closes its batches."""

    def __init__(self, slo_ms: PerModel[float | None], max_batch_size: int, max_wait_s: float,
                 metrics: WorkerMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._slo_ms = slo_ms
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_s
        self._metrics = metrics
        self._clock, self._wall_clock = clock, wall_clock
        self._controllers: dict[tuple[str, str], SloController | None] = {}
        #: The event loop's CPU clock at the last batch (``after_compute``).
        self._loop_cpu = time.thread_time()
        #: model -> its first version label (what a job with no version runs as)
        self._first_label: dict[str, str] = {}

    def controller(self, model: str, version: str) -> SloController | None:
        """The controller of a model version; None when it has no SLO (the fixed wait)."""
        key = (model, version)
        if key not in self._controllers:
            slo_ms = self._slo_ms.for_model(model, version or None)
            self._controllers[key] = None if slo_ms is None else SloController(
                SloConfig(slo_ms / 1000.0, self._max_batch_size))
        return self._controllers[key]

    def waits_ms(self) -> dict[str, float]:
        """Each SLO model's current wait for a request arriving now (the gauge's values)."""
        now = self._clock()
        return {model: round(ctl.wait_s(now) * 1000.0, 3)
                for (model, _), ctl in self._controllers.items() if ctl is not None}

    # --- the batcher's ClosePolicy ---------------------------------------------------

    def close_policy(self) -> ClosePolicy[BatchKey]:
        return self

    def due_at(self, key: BatchKey, size: int, oldest_arrival: float, oldest_origin: float,
               now: float) -> float:
        ctl = self.controller(key.model, key.version)
        if ctl is None:
            return oldest_arrival + self._max_wait_s
        return ctl.due_at(size, oldest_origin, now)

    def batch_size(self, key: BatchKey, size: int, oldest_origin: float, now: float) -> int:
        ctl = self.controller(key.model, key.version)
        return size if ctl is None else ctl.batch_size(size, oldest_origin, now)

    def closed(self, key: BatchKey, size: int, now: float) -> None:
        ctl = self.controller(key.model, key.version)
        if ctl is not None:
            ctl.closed(key, size, now)

    # --- hooks -------------------------------------------------------------------------

    async def on_start(self, ctx: WorkerContext) -> None:
        self._first_label = {m: next(iter(v)) for m, v in ctx.versions.items()}

    async def after_decode(self, intake: Intake) -> None:
        if not intake.jobs:
            return
        counts: dict[tuple[str, str], int] = {}
        for job in intake.jobs:
            model = job.request.model
            key = (model, job.version or self._first_label.get(model, ""))
            counts[key] = counts.get(key, 0) + 1
        now = self._clock()
        for (model, version), n in counts.items():
            ctl = self.controller(model, version)
            if ctl is not None:
                ctl.arrived(n, now)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        key = batch.key
        ctl = self.controller(key.model, key.version)
        if ctl is None:
            return
        # What the event loop spent since the last batch (fetch, decode, write, ack) is
        # part of what a batch costs the worker: for a small model it is most of it, and
        # a controller that learned only the forward pass would close batches too small
        # to keep up (docs/batching.md).
        loop_cpu = time.thread_time()
        spent, self._loop_cpu = loop_cpu - self._loop_cpu, loop_cpu
        if run.forwards == 1:  # a bisected (failing) batch's time says nothing of its size
            # finished_at is compute end: move it onto the monotonic clock
            behind = max(0.0, self._wall_clock() - (run.started_at + run.compute_s))
            ctl.computed(key, len(batch.jobs), run.compute_s + spent, self._clock() - behind)
        if self._metrics is not None:
            self._metrics.batch_close_wait.labels(key.model).set(
                ctl.wait_s(self._clock()) * 1000.0)

    def vitals(self) -> dict[str, Any]:
        return {"batch_close_wait_ms": self.waits_ms()}


def slo_batching(slo_ms: PerModel[float | None], max_batch_size: int, max_wait_ms: float,
                 metrics: WorkerMetrics | None) -> list[Middleware]:
    """``[SloBatching(...)]`` when some model has an SLO, else ``[]`` (the fixed wait)."""
    if not has_slo(slo_ms):
        return []
    return [SloBatching(slo_ms, max_batch_size, max_wait_ms / 1000.0, metrics)]
