"""Worker-side routing: which version of a model computes each request.

The versions a worker holds, their lanes and ``model_version`` strings are the model
layer's (``workers/models/versions.py``); this module only chooses among them.

Routing is deterministic: a request goes to the canary when the hash of its
``routing_key`` (else its ID) falls in the policy's first ``percent`` of
:data:`BUCKETS`. A ``version`` field pins it. While a canary is active the choice
is recorded at the first fetch, so a redelivery keeps it unless a rollback took
that version out of the policy (then stable). A request routed to a version this
worker does not hold is republished to that version's lane (``{model}@{label}``),
which only its holders consume, then acked: it is never computed here. Policies
are re-read from the registry about once a second (one round trip) and the epoch
applied per model is reported in the heartbeat (``policy_epochs``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.control_plane import Routes
from batchfleet.connectors.routes import RouteTable
from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import RolloutPolicy
from batchfleet.workers.completion import answer_without_compute
from batchfleet.workers.intake import Intake
from batchfleet.workers.jobs import Job
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.models import version_lane

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.routing")

BUCKETS = 10_000
POLL_S = 1.0


def bucket(key: str) -> int:
    """A stable bucket in ``[0, BUCKETS)``: the same on every worker and every run."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % BUCKETS


def choose(policy: RolloutPolicy, key: str) -> str:
    """The version a request with this routing key gets under ``policy``."""
    if policy.canary is not None and bucket(key) < round(policy.percent * BUCKETS / 100.0):
        return policy.canary
    return policy.stable


def serving(policy: RolloutPolicy) -> frozenset[str]:
    """The versions that take routed traffic (the shadow only sees copies)."""
    return frozenset(v for v in (policy.stable, policy.canary) if v is not None)


def unknown_version(model: str, label: str, versions: Sequence[str]) -> ErrorInfo:
    return ErrorInfo("unknown_version", f"model {model!r} has no version {label!r} "
                     f"(versions: {', '.join(sorted(versions)) or 'none'})")


class Routing(Middleware):
    """Sets ``job.version`` after decode; republishes what another pool must compute."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self._poll_s = poll_s
        self._ctx: WorkerContext | None = None
        self._plane: Routes | None = None
        self.tables: dict[str, RouteTable] = {}
        #: Per model: the policy epoch applied, and when (the heartbeat reports both).
        self.epochs: dict[str, int] = {}
        self.applied_at: dict[str, float] = {}

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx
        self._plane = ctx.plane.routes
        await self.refresh()

    async def refresh(self) -> None:
        assert self._ctx is not None and self._plane is not None
        tables = await self._plane.tables(list(self._ctx.versions))
        now = time.time()
        for model, table in tables.items():
            if self.epochs.get(model) != table.policy.epoch:
                log.info("rollout policy applied", model=model, epoch=table.policy.epoch,
                         stable=table.policy.stable, canary=table.policy.canary,
                         percent=table.policy.percent)
                self.epochs[model], self.applied_at[model] = table.policy.epoch, now
        self.tables = tables

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._poll()] if self._ctx is not None else []

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self.refresh()
            except BatchfleetError as exc:  # keep routing on the last policy read
                log.warning("cannot read rollout policies", error=str(exc))

    def _policy(self, model: str) -> RolloutPolicy:
        assert self._ctx is not None
        table = self.tables.get(model)
        if table is not None:
            return table.policy
        return RolloutPolicy(next(iter(self._ctx.versions[model])))

    def _target(self, model: str, label: str) -> str:
        """``label`` if any worker ever registered it (if its pool is down, its requests
        wait in its lane: no other version computes them); a label no worker ever had (a
        declared model's placeholder ``default``) is this worker's first version."""
        assert self._ctx is not None
        held = self._ctx.versions[model]
        table = self.tables.get(model)
        if label in held or (table is not None and label in table.versions):
            return label
        return next(iter(held))

    def _held(self, model: str) -> frozenset[str]:
        """Labels some live worker holds (as of the last poll)."""
        table = self.tables.get(model)
        return table.held if table is not None else frozenset()

    async def after_decode(self, intake: Intake) -> None:
        if self._ctx is None or not intake.jobs:
            return
        chosen: dict[int, str] = {}
        fresh: dict[str, dict[str, int]] = {}  # model -> request ID -> job index
        for i, job in enumerate(intake.jobs):
            req, model = job.request, job.request.model
            policy = self._policy(model)
            lane_label = job.delivery.model.partition("@")[2]
            if req.version is not None:
                chosen[i] = req.version
            elif lane_label:  # forwarded here by a worker of another pool
                chosen[i] = lane_label if lane_label in serving(policy) else policy.stable
            else:
                chosen[i] = choose(policy, req.routing_key or req.request_id)
                if policy.canary is not None:
                    fresh.setdefault(model, {})[req.request_id] = i
        await self._settle(intake.jobs, chosen, fresh)
        await self._dispatch(intake, chosen)

    async def _settle(self, jobs: list[Job], chosen: dict[int, str],
                      fresh: dict[str, dict[str, int]]) -> None:
        """Keep the choice made at the first fetch, unless its version left the policy."""
        assert self._plane is not None
        for model, ids in fresh.items():
            policy = self._policy(model)
            recorded = await self._plane.settle(model, {rid: chosen[i] for rid, i in ids.items()})
            for rid, i in ids.items():
                label = recorded.get(rid, chosen[i])
                chosen[i] = label if label in serving(policy) else policy.stable

    async def _dispatch(self, intake: Intake, chosen: dict[int, str]) -> None:
        ctx = self._ctx
        assert ctx is not None
        keep: list[Job] = []
        away: list[Job] = []
        now = time.time()
        exist: dict[str, frozenset[str]] = {}  # per model, once per fetch
        for i, job in enumerate(intake.jobs):
            model, label = job.request.model, chosen[i]
            if (exists := exist.get(model)) is None:
                exists = exist[model] = frozenset(ctx.versions[model]) | self._held(model)
            if job.request.version is not None and label not in exists:
                intake.answers.append(answer_without_compute(
                    job.delivery, job.request, "failed",
                    unknown_version(model, label, sorted(exists)), now))
                continue
            label = self._target(model, label)
            job.version = label
            (keep if label in ctx.versions[model] else away).append(job)
        intake.jobs = keep
        if away and await self._forward(away):
            intake.finished.extend(job.delivery for job in away)

    async def _forward(self, jobs: Sequence[Job]) -> bool:
        """Republish to the chosen versions' lanes; the caller acks only once this is done.
        On failure they are let go unacked: the broker redelivers them."""
        ctx = self._ctx
        assert ctx is not None
        messages = [OutboundMessage(version_lane(j.request.model, j.version), j.delivery.lane,
                                    j.request.request_id, j.delivery.payload) for j in jobs]
        try:
            await ctx.publisher.publish(messages)
        except BatchfleetError as exc:
            log.warning("cannot hand requests to their version's pool; redelivered later",
                        error=str(exc), requests=len(jobs))
            ctx.release([j.delivery for j in jobs])
            return False
        return True

    async def before_compute(self, batch: Batch) -> bool:
        """A batch routed to a version a rollback since removed goes to stable instead."""
        ctx = self._ctx
        if ctx is None or not batch.key.version:
            return True
        policy = self._policy(batch.key.model)
        if batch.key.version in serving(policy) or any(
                j.request.version is not None for j in batch.jobs):
            return True
        stable = self._target(batch.key.model, policy.stable)
        if stable in ctx.versions[batch.key.model]:
            batch.key = replace(batch.key, version=stable)
            for job in batch.jobs:
                job.version = stable
            return True
        for job in batch.jobs:
            job.version = stable
        if await self._forward(batch.jobs):
            await ctx.ack([j.delivery for j in batch.jobs])
        return False

    def vitals(self) -> dict[str, Any]:
        return {"policy_epochs": dict(self.epochs), "policy_applied_at": dict(self.applied_at)}

