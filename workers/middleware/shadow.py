"""Shadow runs: the policy's shadow version sees copies of live stable batches.

A stable batch's inputs and outputs are kept from ``after_compute`` until its results
are written and acked (``after_complete``); only then does the shadow version run on
the copy, on a thread of its own (``shadow_thread``), never in the compute thread, so
a slow shadow can never hold a stable batch back. A batch is skipped, and counted as
skipped with its reason, when the shadow thread is busy (one shadow batch at a time),
the model's shadow is resting under its time budget (``--shadow-budget``), stable work
is backed up (a full batch waiting in the batcher, the pending writes at their cap: a
CPU-bound shadow shares the cores), or this worker does not hold the shadow version.
Shadow outputs go nowhere but the comparison: never a result, never an answer.

Every stable request of a model whose policy names a shadow is counted exactly once:
compared, skipped or error. The comparisons (``connectors.rollout_stats``) are
flushed every ``every_s`` for ``rollout report``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.control_plane import RolloutStats
from batchfleet.connectors.rollout_stats import (
    ComparisonDelta,
    compare_outputs,
)
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.completion import Completed
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.output_stats import OutputStats
from batchfleet.workers.middleware.rollout_stats import (
    PolicyCache,
    VersionStats,
    batch_label,
    worker_versions,
)
from batchfleet.workers.middleware.shadow_thread import (
    DEFAULT_BUDGET,
    ShadowBudget,
    ShadowThread,
    Span,
    delayed_by,
)
from batchfleet.workers.models import ModelHandler, version_lane
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun, bisect_run

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

#: Stable requests kept for a shadow run at most (their completion was lost when the
#: grace period ran out); past it the oldest batch is counted skipped.
MAX_WAITING = 65536
#: Unflushed comparisons kept while the store refuses them (newest kept).
MAX_UNFLUSHED = 64
#: Batches remembered as handed over beside a shadow forward (one cancelled at the grace
#: period or whose containment crashed never comes back for its entry).
MAX_HANDED = 1024


@dataclass(slots=True)
class Copy:
    """A stable batch's inputs and outputs, waiting for its results to be written."""

    model: str
    stable: str
    shadow: str
    epoch: int
    request_ids: list[str]
    inputs: list[Tensors]
    outputs: list[Tensors]
    stable_ms: float


def run_shadow(handler: ModelHandler, inputs: Sequence[Tensors]
               ) -> tuple[list[Tensors | BaseException], float]:
    """The shadow forward (shadow thread): per-request outputs or errors, and its ms."""
    def forward(part: Sequence[Tensors]) -> list[Tensors]:
        return handler.postprocess(handler.predict(handler.preprocess(part)), len(part))

    start = time.perf_counter()
    outputs = bisect_run(forward, inputs)
    return outputs, (time.perf_counter() - start) * 1000.0


class Shadow(Middleware):
    def __init__(self, metrics: WorkerMetrics, policies: PolicyCache, versions: VersionStats,
                 every_s: float = 2.0,
                 budget: PerModel[float | None] = DEFAULT_BUDGET) -> None:
        self._metrics = metrics
        self._thread = ShadowThread()
        self._budget = ShadowBudget(budget)
        #: Batches handed to compute while a shadow forward ran: id(batch) -> the batch (held,
        #: so its id is not reused while here) and that forward; bounded (see ``_hand``).
        self._handed: dict[int, tuple[Batch, Span]] = {}
        self._policies = policies
        self._versions = versions
        self._every_s = every_s
        self._ctx: WorkerContext | None = None
        self._stats: RolloutStats | None = None
        self._waiting: dict[str, Copy] = {}  # request ID -> its batch's copy
        self._running: asyncio.Task[None] | None = None
        #: model -> (epoch, comparisons since the last flush); older epochs wait in _old.
        self._deltas: dict[str, tuple[int, ComparisonDelta]] = {}
        self._old: list[tuple[str, int, ComparisonDelta]] = []
        #: The output statistics, if this worker keeps them: a shadow's answers count too.
        self._outputs: OutputStats | None = None

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx
        self._stats = ctx.plane.rollout_stats
        self._outputs = ctx.find(OutputStats)

    async def before_compute(self, batch: Batch) -> bool:
        if self._thread.current is not None:
            self._handed[id(batch)] = (batch, self._thread.current)
            while len(self._handed) > MAX_HANDED:  # batches that never reached after_compute
                del self._handed[next(iter(self._handed))]
        return True

    async def on_dropped(self, batch: Batch) -> None:
        self._handed.pop(id(batch), None)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        model, label = batch.key.model, batch_label(batch)
        handed = self._handed.pop(id(batch), None)
        span = handed[1] if handed is not None and handed[0] is batch else None
        if span is not None:  # any model's batch: shadow work must delay none of them
            self._metrics.beside_shadow.labels(model).inc()
            if delayed_by(span, run.started_at, run.thread):
                self._metrics.delayed_by_shadow.labels(model).inc()
        policy = self._policies.get(model)
        if policy is None or policy.shadow is None or label != policy.stable:
            return
        ok = [(j, o) for j, o in zip(batch.jobs, run.outputs, strict=True)
              if not isinstance(o, BaseException)]
        if not ok:
            return
        copy = Copy(model, label, policy.shadow, policy.epoch,
                    [j.request.request_id for j, _ in ok], [j.request.inputs for j, _ in ok],
                    [o for _, o in ok], run.compute_s * 1000.0)
        for rid in copy.request_ids:
            self._waiting[rid] = copy
        while len(self._waiting) > MAX_WAITING:  # completions lost (grace over): bound it
            self._skip(self._waiting[next(iter(self._waiting))], "overflow")

    def after_complete(self, done: Completed) -> None:
        copies = {id(c): c for a in done.answers
                  if (c := self._waiting.get(a.result.request_id)) is not None}
        for copy in copies.values():
            for rid in copy.request_ids:
                self._waiting.pop(rid, None)
            reason = self._skip_reason(copy)
            if reason:
                self._skip(copy, reason)
            else:
                self._running = asyncio.get_running_loop().create_task(self._run(copy))

    def _skip_reason(self, copy: Copy) -> str:
        """Why this copy is not shadowed now ("" when it may run)."""
        if self._running is not None or self._thread.busy:
            return "busy"
        if not self._budget.allows(copy.model, copy.shadow, time.monotonic()):
            return "budget"
        return "backlog" if self._backed_up() else ""

    def _backed_up(self) -> bool:
        """A full batch waits for compute, or the writes are at their cap."""
        w = self._ctx
        if w is None:
            return True
        buffered = sum(w.in_flight().values()) - w.compute.computing[1]
        writes = w.pending_writes()  # the cap that pushes back on compute
        return (buffered >= w.settings.max_batch_size
                or writes >= w.settings.max_pending_writes)

    def _delta(self, copy: Copy) -> ComparisonDelta:
        held = self._deltas.get(copy.model)
        if held is None or held[0] != copy.epoch:
            if held is not None:
                self._old.append((copy.model, *held))
            held = self._deltas[copy.model] = (copy.epoch, ComparisonDelta(copy.stable,
                                                                           copy.shadow))
        return held[1]

    def _skip(self, copy: Copy, reason: str) -> None:
        for rid in copy.request_ids:
            self._waiting.pop(rid, None)
        self._delta(copy).skipped += len(copy.request_ids)
        self._metrics.shadow_requests.labels(copy.model, "skipped").inc(len(copy.request_ids))
        self._metrics.shadow_skipped.labels(copy.model, reason).inc()

    async def _run(self, copy: Copy) -> None:
        try:
            await self._compare(copy)
        except asyncio.CancelledError:  # stopping, with the shadow forward still running
            self._skip(copy, "stopping")
            raise
        finally:
            self._running = None

    async def _compare(self, copy: Copy) -> None:
        assert self._ctx is not None
        handler = worker_versions(self._ctx).get(copy.model, {}).get(copy.shadow)
        if handler is None:  # the shadow lives on another pool: nothing to run it on here
            self._skip(copy, "absent")
            return
        # bounded like a stable batch of its lane: a shadow that hangs must not wedge the
        # shadow thread (every later copy skipped "busy") for the worker's lifetime
        limit = self._ctx.compute.limits.limit_s(version_lane(copy.model, copy.shadow))
        running = self._thread.run(lambda: run_shadow(handler, copy.inputs))
        try:
            outputs, shadow_ms = await bounded(asyncio.shield(running), limit)
        except TimeoutError:
            running.add_done_callback(_retrieve)
            self._thread.shutdown()  # it ends once the forward returns, if ever; a daemon
            self._thread = ShadowThread()
            self._budget.spent(copy.model, copy.shadow, limit, time.monotonic())
            log.warning("shadow forward past its limit: its thread is abandoned",
                        model=copy.model, shadow=copy.shadow, limit_s=round(limit, 3))
            self._skip(copy, "stalled")
            return
        self._budget.spent(copy.model, copy.shadow, shadow_ms / 1000.0, time.monotonic())
        delta, m = self._delta(copy), self._metrics
        errors = 0
        for stable, shadow in zip(copy.outputs, outputs, strict=True):
            diff = None if isinstance(shadow, BaseException) else compare_outputs(stable, shadow)
            if diff is None:
                errors += 1
                continue
            delta.add(diff)
            m.shadow_diff.labels(copy.model).observe(diff.max_abs)
        delta.errors += errors
        delta.add_latency("stable", copy.stable_ms)
        delta.add_latency("shadow", shadow_ms)
        n = len(copy.request_ids)
        if n - errors:
            m.shadow_requests.labels(copy.model, "compared").inc(n - errors)
        if errors:
            m.shadow_requests.labels(copy.model, "error").inc(errors)
        self._versions.record(copy.model, copy.shadow, "shadow", n, errors, shadow_ms / 1000.0)
        if self._outputs is not None:  # the shadow's answers in its output statistics
            good = [(o, i) for o, i in zip(outputs, copy.inputs, strict=True)
                    if not isinstance(o, BaseException)]
            if good:
                self._outputs.record(copy.model, copy.shadow, [o for o, _ in good],
                                     [i for _, i in good])

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()] if self._ctx is not None else []

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            await self.flush()

    async def on_stop(self, ctx: WorkerContext) -> None:
        running = self._running
        if running is not None:  # a shadow run is bounded by one forward
            await asyncio.wait({running}, timeout=ctx.settings.grace_s)
            if not running.done():  # a wedged shadow: its thread is a daemon, left behind
                await cancel_until_done([running])
        self._thread.shutdown()
        for copy in {id(c): c for c in self._waiting.values()}.values():
            self._skip(copy, "stopping")
        await self.flush()

    async def flush(self) -> None:
        """Write the comparisons held; a failed write keeps them for the next flush."""
        if self._stats is None:
            return
        todo = [*self._old, *((m, e, d) for m, (e, d) in self._deltas.items())]
        self._old, self._deltas = [], {}
        for model, epoch, delta in todo:
            if delta.empty:
                continue
            try:
                await self._stats.flush_comparisons(model, epoch, delta)
            except BatchfleetError as exc:
                log.info("shadow comparisons not flushed; kept for the next flush",
                         model=model, error=str(exc))
                self._old.append((model, epoch, delta))
        del self._old[:-MAX_UNFLUSHED]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An abandoned shadow forward's late outcome is discarded; read it so asyncio is quiet."""
    if not future.cancelled():
        future.exception()
