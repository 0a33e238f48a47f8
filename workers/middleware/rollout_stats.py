"""Per-version stats: requests, errors and compute latency per version label and role.

``rollout status`` and the automatic rollback guard read them merged over the fleet,
so each worker counts its batches in memory (one update per batch, never per
request) and flushes a delta every ``every_s`` into ``connectors.rollout_stats``,
stamped with the policy epoch it applied; the same numbers feed the Prometheus
metrics labelled by version and role. :class:`PolicyCache` is the worker's view of
the rollout policies, shared with the shadow and guard middleware.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.control_plane import RolloutStats
from batchfleet.connectors.output_report import role_of
from batchfleet.connectors.rollout_stats import VersionDelta
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import DEFAULT_LABEL, RolloutPolicy
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.routing import Routing
from batchfleet.workers.models import Versions
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")
#: How many unflushed deltas a worker keeps while the store refuses them.
_KEEP_UNFLUSHED = 256


def batch_label(batch: Batch) -> str:
    """The version label a batch runs (batches are per version; unlabelled: ``default``)."""
    return batch.key.version or DEFAULT_LABEL


def worker_versions(ctx: WorkerContext) -> Versions:
    """``{model: {label: handler}}``: every version this worker holds."""
    return ctx.versions


def counts_as_failure(output: object) -> bool:
    """Whether one request's outcome counts as an error for the per-version stats, and so
    for the rollout guard's error test: the one place that decides for computed batches.
    A degraded answer is an error too: after the ``error`` trigger its compute failed
    (counted here); with the breaker open ``count_degraded`` counts it."""
    return isinstance(output, BaseException)




class PolicyCache:
    """The rollout policies of this worker's models. With the routing middleware in the
    chain these are the very policies it routes by (no second poll, no lag between the
    version a batch ran and the role it is counted under); without it, a poll of the
    registry at most every ``every_s``."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self._polled: dict[str, RolloutPolicy] = {}
        self._routing: Routing | None = None
        self._read_at = 0.0

    @property
    def policies(self) -> dict[str, RolloutPolicy]:
        if self._routing is not None:
            return {m: t.policy for m, t in self._routing.tables.items()}
        return self._polled

    def get(self, model: str) -> RolloutPolicy | None:
        if self._routing is not None:
            table = self._routing.tables.get(model)
            return table.policy if table is not None else None
        return self._polled.get(model)

    def epoch(self, model: str) -> int:
        policy = self.get(model)
        return policy.epoch if policy is not None else 0

    async def refresh(self, ctx: WorkerContext, force: bool = False) -> None:
        """Re-read the policies (one round trip), at most every ``every_s`` unless forced;
        a failed read keeps the last ones."""
        self._routing = ctx.find(Routing)
        now = time.monotonic()
        if not force and now - self._read_at < self.every_s:
            return
        self._read_at = now
        try:
            if self._routing is not None:
                await self._routing.refresh()
            else:
                self._polled = await ctx.plane.models.policies(
                    sorted(worker_versions(ctx)))
        except BatchfleetError as exc:
            log.info("rollout policies not re-read", error=str(exc))


class VersionStats(Middleware):
    """Counts each computed batch under its (model, label, role) and flushes the deltas."""

    def __init__(self, metrics: WorkerMetrics, policies: PolicyCache,
                 every_s: float = 2.0) -> None:
        self._metrics = metrics
        self.policies = policies
        self._every_s = every_s
        self._ctx: WorkerContext | None = None
        self._stats: RolloutStats | None = None
        #: model -> (epoch, {(label, role): delta}) since the last flush.
        self._deltas: dict[str, tuple[int, dict[tuple[str, str], VersionDelta]]] = {}
        #: Deltas of an older epoch, or whose flush failed, waiting for the next flush.
        self._pending_old: list[tuple[str, tuple[int, dict[tuple[str, str], VersionDelta]]]] = []

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx
        self._stats = ctx.plane.rollout_stats
        await self.policies.refresh(ctx, force=True)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        model, label = batch.key.model, batch_label(batch)
        failed = [counts_as_failure(o) for o in run.outputs]
        # The fleet stats count a request once, at its first attempt: a retry of a failing
        # request is neither a new request nor a new error (the guard's rate is per request).
        first = [f for j, f in zip(batch.jobs, failed, strict=True) if j.request.attempt <= 1]
        self.record(model, label, role_of(self.policies.get(model), label), len(batch.jobs),
                    sum(failed), run.compute_s, counted=(len(first), sum(first)))

    def record(self, model: str, label: str, role: str, size: int, errors: int,
               compute_s: float, counted: tuple[int, int] | None = None) -> None:
        """One batch of a version (also the shadow's runs, under role ``shadow``): every
        computation in the metrics, ``counted`` (requests, errors) in the fleet stats."""
        epoch = self.policies.epoch(model)
        held = self._deltas.get(model)
        if held is None or held[0] != epoch:  # a new epoch: what was held flushes first
            if held is not None:
                self._pending_old.append((model, held))
            held = self._deltas[model] = (epoch, {})
        requests, failed = counted if counted is not None else (size, errors)
        held[1].setdefault((label, role), VersionDelta()).add_batch(requests, failed,
                                                                   compute_s * 1000.0)
        m = self._metrics
        if size - errors:
            m.version_requests.labels(model, label, role, "ok").inc(size - errors)
        if errors:
            m.version_requests.labels(model, label, role, "error").inc(errors)
        m.version_compute.labels(model, label, role).observe(compute_s)

    def count_degraded(self, batch: Batch, answered: int) -> None:
        """Requests a fallback chain answered in this version's place (its breaker open;
        docs/degradation.md): errors for the guard, so a broken canary never looks
        healthy behind its fallback. No compute, so no latency is recorded. (A degraded
        answer after the ``error`` trigger was already counted: its compute failed.)"""
        model, label = batch.key.model, batch_label(batch)
        role = role_of(self.policies.get(model), label)
        epoch = self.policies.epoch(model)
        held = self._deltas.get(model)
        if held is None or held[0] != epoch:
            if held is not None:
                self._pending_old.append((model, held))
            held = self._deltas[model] = (epoch, {})
        delta = held[1].setdefault((label, role), VersionDelta())
        delta.requests += answered
        delta.errors += answered
        self._metrics.version_requests.labels(model, label, role, "error").inc(answered)

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()] if self._ctx is not None else []

    async def on_stop(self, ctx: WorkerContext) -> None:
        await self.flush()

    async def _loop(self) -> None:
        assert self._ctx is not None
        while True:
            await asyncio.sleep(self._every_s)
            await self.policies.refresh(self._ctx)
            await self.flush()

    async def flush(self) -> None:
        """Write every delta held; one that fails is kept for the next flush."""
        if self._stats is None:
            return
        todo = [*self._pending_old, *self._deltas.items()]
        self._pending_old, self._deltas = [], {}
        for model, (epoch, deltas) in todo:
            try:
                await self._stats.flush_versions(model, epoch, deltas)
            except BatchfleetError as exc:
                log.info("version stats not flushed; kept for the next flush", model=model,
                         error=str(exc))
                self._pending_old.append((model, (epoch, deltas)))
        del self._pending_old[:-_KEEP_UNFLUSHED]  # the store is down for long: keep the newest
