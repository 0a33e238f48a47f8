"""The automatic rollback guard: a canary that misbehaves is rolled back by itself.

Every worker runs the check (no leader to elect or lose): every ``every_s`` it reads
the fleet-merged per-version stats of each of its models with a canary and judges them
with the tests of :mod:`batchfleet.workers.rollout_verdicts` (significance as well as
the policy's thresholds, ``GuardThresholds``), plus the output checks over an
:class:`~batchfleet.workers.rollout_evidence.EvidenceSource` when one is given. A
failing test calls ``rollback(..., who="guard", if_canary=canary)``: a compare-and-set
on the policy epoch that does nothing once the canary changed, so however many workers
decide at once, one rollback happens, and only the worker whose call changed the
policy logs it and counts it (``batchfleet_rollout_auto_rollbacks_total``). Stats of
another epoch than the policy's are never judged: the rollout is measured over its own
traffic. The stats count requests wherever the canary runs, so a canary on a separate
worker pool is judged the same way by every worker of the model.
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
from batchfleet.workers.rollout_evidence import EvidenceSource, OutputEvidence
from batchfleet.workers.rollout_verdicts import (
    Streak,
    error_verdict,
    latency_excess,
    latency_judgeable,
    output_verdict,
)

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")


def guard_verdict(policy: RolloutPolicy, stable: RoleStats, canary: RoleStats,
                  evidence: tuple[OutputEvidence, OutputEvidence] | None = None
                  ) -> str | None:
    """Why the canary must be rolled back at once (errors, outputs), or None; latency
    needs a streak of evaluations and is judged by :class:`RolloutGuard` itself."""
    if policy.canary is None:
        return None
    return error_verdict(policy.guard, stable, canary) or output_verdict(policy.guard,
                                                                         evidence)


class RolloutGuard(Middleware):
    def __init__(self, metrics: WorkerMetrics, policies: PolicyCache,
                 every_s: float = 2.0, evidence: EvidenceSource | None = None) -> None:
        self._metrics = metrics
        self._policies = policies
        self._every_s = every_s
        #: Output evidence (PSI, NaN rates); None: those checks are skipped (logged once).
        self._evidence = evidence
        self._said_no_evidence = False
        self._ctx: WorkerContext | None = None
        #: Latency streaks and epoch start times, per (model, policy epoch).
        self._streaks: dict[tuple[str, int], Streak] = {}
        self._since: dict[tuple[str, int], float] = {}
        #: Rollbacks this worker made: (model, epoch it wrote, why).
        self.rollbacks: list[tuple[str, int, str]] = []
        #: Judgements made with both versions past the latency minimums (tests read it).
        self.latency_judged = 0

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
        """Judge every model with a canary once; roll back those that fail a test."""
        ctx = self._ctx
        assert ctx is not None
        await self._policies.refresh(ctx)
        stats = ctx.plane.rollout_stats
        live: set[tuple[str, int]] = set()
        for model, policy in sorted(self._policies.policies.items()):
            if policy.canary is None:
                continue
            live.add((model, policy.epoch))
            found = await stats.read_versions(model, (policy.stable, policy.canary))
            stable, canary = found[policy.stable], found[policy.canary]
            if canary.epoch != policy.epoch:
                continue  # nothing measured under this policy yet
            # stable's record from an older epoch is not this rollout's baseline: none then
            base = stable.role("stable" if stable.epoch == policy.epoch else "-")
            can = canary.role("canary")
            why = guard_verdict(policy, base, can, await self._output_evidence(model, policy))
            if why is None:
                excess = latency_excess(policy.guard, base, can)
                self.latency_judged += latency_judgeable(policy.guard, base, can)
                streak = self._streaks.setdefault((model, policy.epoch), Streak())
                why = streak.observe(can.latency.total, excess)
            if why is not None:
                await self._roll_back(ctx, model, policy, why)
        for key in set(self._streaks) - live:  # epochs gone: forget their state
            del self._streaks[key]
        for key in set(self._since) - live:
            del self._since[key]

    async def _output_evidence(self, model: str, policy: RolloutPolicy
                               ) -> tuple[OutputEvidence, OutputEvidence] | None:
        """Output evidence since the epoch began, when the policy asks for output checks."""
        g = policy.guard
        if g.psi is None and g.nan_points is None:
            return None
        if self._evidence is None:
            if not self._said_no_evidence:
                self._said_no_evidence = True
                log.warning("rollout guard: no output statistics on this worker; the PSI "
                            "and NaN checks are skipped", model=model)
            return None
        assert self._ctx is not None and policy.canary is not None
        key = (model, policy.epoch)
        if key not in self._since:
            changes = await self._ctx.plane.models.history(model, 1)
            self._since[key] = (changes[0].at if changes and changes[0].policy.epoch
                                == policy.epoch else 0.0)
        try:
            return await self._evidence.output_evidence(model, policy.canary, policy.stable,
                                                        self._since[key])
        except BatchfleetError as exc:  # the output checks wait; errors and latency do not
            log.info("rollout guard: no output evidence this round", model=model,
                     error=str(exc))
            return None

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
