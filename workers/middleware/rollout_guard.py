"""The automatic rollback guard: a canary that misbehaves is rolled back by itself.

Every worker runs the check (no leader to elect or lose): every ``every_s`` it reads
the fleet-merged per-version stats of each of its models with a canary, and when the
policy's thresholds (``GuardThresholds``) are crossed over at least ``min_window``
canary requests, it calls ``rollback(..., who="guard", if_canary=canary)``. That call
is a compare-and-set on the policy epoch that does nothing once the canary changed,
so however many workers decide at once, one rollback happens, and only the worker
whose call changed the policy logs it and counts it
(``batchfleet_rollout_auto_rollbacks_total``). Stats of another epoch than the
policy's are never judged: the rollout is measured over its own traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.rollout_stats import RoleStats
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import RolloutPolicy
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Middleware
from batchfleet.workers.middleware.rollout_stats import PolicyCache
from batchfleet.workers.rollout_evidence import EvidenceSource

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

#: Latency is judged only once both versions have this many batches (a p99 of a few
#: batches is one slow batch).
MIN_BATCHES_FOR_P99 = 20


def guard_verdict(policy: RolloutPolicy, stable: RoleStats, canary: RoleStats) -> str | None:
    """Why the canary must be rolled back, or None while it is within the thresholds."""
    g = policy.guard
    if policy.canary is None or canary.requests < g.min_window:
        return None
    points = (canary.error_rate - stable.error_rate) * 100.0
    if points > g.error_points:
        return (f"canary error rate {canary.error_rate:.1%} vs stable {stable.error_rate:.1%} "
                f"over {canary.requests} requests")
    if min(canary.latency.total, stable.latency.total) >= MIN_BATCHES_FOR_P99:
        c99, s99 = canary.latency.percentile(0.99), stable.latency.percentile(0.99)
        if c99 is not None and s99 and c99 > g.p99_ratio * s99:
            return (f"canary p99 compute {c99:.2f} ms vs stable {s99:.2f} ms "
                    f"({c99 / s99:.1f}x, limit {g.p99_ratio:g}x) over {canary.requests} "
                    "requests")
    return None


class RolloutGuard(Middleware):
    def __init__(self, metrics: WorkerMetrics, policies: PolicyCache,
                 every_s: float = 2.0, evidence: EvidenceSource | None = None) -> None:
        self._metrics = metrics
        self._policies = policies
        self._every_s = every_s
        #: Output evidence (PSI, NaN rates); None: those checks are skipped.
        self._evidence = evidence
        self._ctx: WorkerContext | None = None
        #: Rollbacks this worker made: (model, epoch it wrote, why).
        self.rollbacks: list[tuple[str, int, str]] = []

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()] if self._ctx is not None else []

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self.check()
            except BatchfleetError as exc:
                log.info("rollout guard check skipped", error=str(exc))

    async def check(self) -> None:
        """Judge every model with a canary once; roll back those past their thresholds."""
        ctx = self._ctx
        assert ctx is not None
        await self._policies.refresh(ctx)
        stats = ctx.plane.rollout_stats
        for model, policy in sorted(self._policies.policies.items()):
            if policy.canary is None:
                continue
            found = await stats.read_versions(model, (policy.stable, policy.canary))
            stable, canary = found[policy.stable], found[policy.canary]
            if canary.epoch != policy.epoch:
                continue  # nothing measured under this policy yet
            # stable's record from an older epoch is not this rollout's baseline: none then
            baseline = stable.role("stable" if stable.epoch == policy.epoch else "-")
            why = guard_verdict(policy, baseline, canary.role("canary"))
            if why is not None:
                await self._roll_back(ctx, model, policy, why)

    async def _roll_back(self, ctx: WorkerContext, model: str, policy: RolloutPolicy,
                         why: str) -> None:
        done = await ctx.plane.models.rollback(
            model, who="guard", why=why, if_canary=policy.canary)
        if done is None:
            return  # another worker (or an operator) changed the policy first
        self.rollbacks.append((model, done.epoch, why))
        self._metrics.auto_rollbacks.labels(model).inc()
        log.warning("rollout guard rolled back the canary", model=model,
                    canary=policy.canary, stable=done.stable, epoch=done.epoch, why=why)
        await self._policies.refresh(ctx, force=True)
