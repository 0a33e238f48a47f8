"""Models loaded on demand within a budget (``--max-loaded-models``, ``--model-memory-mb``;
docs/models.md, "Loading on demand").

Every model the worker is given is advertised, but only the loaded ones are read: the
others' lanes are paused through the same seam an open breaker uses
(``paused_models``), so their requests wait in the broker and never fail for being cold
(on Kafka that pauses the partitions). A side loop reads the lanes' depth and oldest
age (``Consumer.backlog``: one XLEN and one XRANGE COUNT 1 per stream on Redis) a few
times a second, asks the pure rules of ``workers.residency`` what to do, and does it:

* **load** on the compute thread's loader thread (build, set-up, warm-up at the batch
  sizes it will run), so other models' batches keep computing; the lane is resumed only
  once the warm-up ran, so no request pays for it;
* **evict** by pausing the lane first, waiting until the fetch loop has stopped reading
  it and nothing of the model is fetched and unacked, then dropping its handlers on the
  compute thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.broker import LaneBacklog
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.pauses import base_model
from batchfleet.workers.models.versions import version_lane
from batchfleet.workers.residency import Limits, Resident, decide, wanted
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.settings import WorkerSettings

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

POLL_S = 0.1
#: After a failed load, the model is not tried again for this long (its requests wait).
RETRY_LOAD_S = 5.0


def warmup_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes a version is warmed up at: one, a small batch and the largest."""
    return tuple(sorted({1, min(8, max_batch_size), max_batch_size}))


def waiting_ages(backlog: Sequence[LaneBacklog], seen_since: dict[str, float],
                 now: float) -> dict[str, float]:
    """Each model with work waiting -> its oldest request's age: the transport's (Redis:
    the stream's first entry), else since this worker first saw it waiting (Kafka: lag
    has no age); ``seen_since`` is kept up to date in place."""
    waiting: dict[str, float] = {}
    for lane in backlog:
        if lane.depth > 0:
            model = base_model(lane.model)
            age = lane.oldest_age_s
            if age is None:
                age = now - seen_since.setdefault(model, now)
            waiting[model] = max(waiting.get(model, 0.0), age)
    for model in set(seen_since) - set(waiting):
        del seen_since[model]
    return waiting


def estimate_mb(handlers: Iterable[object]) -> float:
    """What loading a model's versions is expected to take before one load measured it."""
    return sum(float(getattr(h, "estimate_mb", 0.0)) for h in handlers)


def model_residency(s: WorkerSettings, metrics: WorkerMetrics) -> list[Middleware]:
    """The middleware where models load on demand (a count or memory limit is set)."""
    if not s.on_demand:
        return []
    limits = Limits(s.max_loaded_models, s.model_memory_mb, s.min_residency_s)
    return [ModelResidency(limits, lambda m: s.cold_load_after_ms.for_model(m) / 1000.0,
                           metrics, s.max_batch_size)]


class ModelResidency(Middleware):
    def __init__(self, limits: Limits, cold_after_s: Callable[[str], float],
                 metrics: WorkerMetrics | None = None, max_batch_size: int = 64,
                 poll_s: float = POLL_S) -> None:
        self.limits = limits
        self._cold_after_s = cold_after_s
        self._metrics = metrics
        self._sizes = warmup_sizes(max_batch_size)
        self._poll_s = poll_s
        self._ctx: WorkerContext | None = None
        #: Loaded models: when loaded, last used, measured MiB.
        self.loaded: dict[str, Resident] = {}
        #: What each model measured when last loaded (its next load's estimate).
        self.memory_mb: dict[str, float] = {}
        self.loading: str | None = None
        #: Being evicted: paused; dropped once quiet (``_quiet``) with nothing in flight.
        self.draining: set[str] = set()
        self._quiet: set[str] = set()
        self._drain_started: dict[str, float] = {}
        #: When a lane was first seen with work (where the transport cannot say its age).
        self._seen_since: dict[str, float] = {}
        self._failed_until: dict[str, float] = {}
        self._load_task: asyncio.Task[None] | None = None
        self.loads = self.evictions = 0

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()] if self._ctx is not None else []

    def serving(self) -> frozenset[str]:
        return frozenset(self.loaded) - self.draining

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        serving = self.serving()
        return frozenset(m for m in models if base_model(m) not in serving)

    def on_paused(self, models: frozenset[str]) -> None:
        self._quiet |= {base_model(m) for m in models} & self.draining

    def pause_s(self) -> float | None:
        return self._poll_s

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        model = batch.key.model
        if (found := self.loaded.get(model)) is not None:
            self.loaded[model] = Resident(found.loaded_at, time.monotonic(), found.memory_mb)

    def vitals(self) -> dict[str, Any]:
        return {"loaded": sorted(self.serving()),
                "loading": [self.loading] if self.loading else [],
                "model_loads": self.loads, "model_evictions": self.evictions}

    async def _loop(self) -> None:
        assert self._ctx is not None
        while not self._ctx.stopping.is_set():
            await asyncio.sleep(self._poll_s)
            try:
                await self.tick()
            except BatchfleetError as exc:  # a broker outage: decide again next tick
                log.warning("cannot read lane backlog for loading on demand", error=str(exc))

    async def tick(self) -> None:
        """One look: finish evictions whose model went quiet, then decide once."""
        ctx = self._ctx
        assert ctx is not None
        if ctx.served is not None:  # ``models list``: where each model is loaded
            serving = self.serving()
            ctx.served.loaded = {m: m in serving for m in ctx.versions}
        in_flight = ctx.in_flight()
        # quiet: the fetch loop paused the lane (or, were it paused already by a breaker
        # or an operator, has come round since: a fetch returns within its timeout)
        settle_s = ctx.settings.fetch_timeout_ms / 1000.0 + 1.0
        for model in sorted(self.draining):
            quiet = (model in self._quiet
                     or time.monotonic() - self._drain_started.get(model, 0.0) > settle_s)
            if quiet and not in_flight.get(model):
                await self._evict(model)
        if self.draining or self.loading is not None:
            return
        now = time.monotonic()
        waiting = waiting_ages(await ctx.consumer.backlog(), self._seen_since, now)
        residents = {m: Resident(r.loaded_at, r.last_used, r.memory_mb,
                                 busy=m in waiting or in_flight.get(m, 0) > 0)
                     for m, r in self.loaded.items()}
        candidates = {m: age for m, age in waiting.items()
                      if m in ctx.versions and self._failed_until.get(m, 0.0) <= now
                      and not any(getattr(h, "removed", False)  # left the repository
                                  for h in ctx.versions[m].values())}
        want = wanted(candidates, list(self.loaded),
                      {m: self._cold_after_s(m) for m in candidates})
        expected = {m: self.memory_mb.get(m, estimate_mb(ctx.versions[m].values()))
                    for m in want}
        decision = decide(residents, want, candidates, expected, self.limits, now)
        if decision.evict:  # the load waits for them; the next ticks decide it again
            for model in decision.evict:
                log.info("evicting model", model=model, to_load=decision.load)
            self.draining.update(decision.evict)
            self._drain_started.update(dict.fromkeys(decision.evict, now))
        elif decision.load is not None:
            self.loading = decision.load
            self._load_task = asyncio.create_task(self._load(decision.load))

    async def _load(self, model: str) -> None:
        ctx = self._ctx
        assert ctx is not None
        labels = list(ctx.versions[model])
        try:
            built = await ctx.compute.load([version_lane(model, label) for label in labels],
                                           self._sizes)
        except Exception as exc:  # user code: its requests wait; tried again later
            log.error("loading model failed; its requests wait in their lane",
                      model=model, error=f"{type(exc).__name__}: {exc}",
                      retry_in_s=RETRY_LOAD_S)
            self._failed_until[model] = time.monotonic() + RETRY_LOAD_S
            return
        finally:
            self.loading = None
        now = time.monotonic()
        memory = sum(b.memory_mb for b in built)
        self.memory_mb[model] = memory
        self.loaded[model] = Resident(now, now, memory)
        self.loads += 1
        for label, b in zip(labels, built, strict=True):
            if self._metrics is not None:
                self._metrics.residency.on_model_loaded(model, label, b.load_s, b.warmup_s)
        log.info("model loaded", model=model, memory_mb=round(memory, 1),
                 load_s=round(sum(b.load_s for b in built), 3),
                 warmup_s=round(sum(b.warmup_s for b in built), 3),
                 loaded=sorted(self.loaded))

    async def _evict(self, model: str) -> None:
        ctx = self._ctx
        assert ctx is not None
        labels = list(ctx.versions[model])
        await ctx.compute.unload([version_lane(model, label) for label in labels])
        self.loaded.pop(model, None)
        self.draining.discard(model)
        self._quiet.discard(model)
        self.evictions += 1
        if self._metrics is not None:
            for label in labels:
                self._metrics.residency.on_model_evicted(model, label)
        log.info("model evicted", model=model, loaded=sorted(self.loaded))
