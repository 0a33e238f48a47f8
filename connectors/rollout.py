"""Rollout operations for Python callers, the CLI and the gateway: one implementation.

:class:`Rollouts` wraps the registry's policy API (``set``, ``promote``, ``rollback``,
each recorded with who and why) and adds :meth:`Rollouts.status`: the policy, its
history and the live per-version stats workers publish (``connectors.rollout_stats``),
so ``batchfleet rollout status``, ``GET /v1/models/{model}/rollout`` and a notebook
read the same thing::

    rollouts = open_rollouts("redis://localhost:6379/0", Names())
    await rollouts.set("demo-mlp", stable="default", canary="v2", percent=20,
                       who=default_who(), why="try v2")
    print((await rollouts.status("demo-mlp")).to_json())
    await rollouts.rollback("demo-mlp", who=default_who(), why="v2 is slower")
    await rollouts.close()

A policy change reaches workers by their poll of the registry (they report the epoch
they apply in their heartbeat); nothing here talks to workers.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import ModelRegistry, RedisModelRegistry
from batchfleet.connectors.rollout_stats import RedisRolloutStats, ShadowReport, VersionStats
from batchfleet.schemas.errors import UnknownModelError, ValidationError
from batchfleet.schemas.heartbeat import LIVE_WITHIN_S, HeartbeatRecord
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import (
    GuardThresholds,
    ModelRecord,
    PolicyChange,
    RolloutPolicy,
)

#: How many history entries ``status`` shows unless asked for more.
STATUS_HISTORY = 20


class VersionStatsReader(Protocol):
    """Where per-version stats and shadow comparisons come from (``RedisRolloutStats``)."""

    async def read_versions(self, model: str, labels: Iterable[str]
                            ) -> Mapping[str, VersionStats]: ...

    async def read_comparisons(self, model: str) -> ShadowReport | None: ...


class HeartbeatReader(Protocol):
    """Where the epoch each worker applies comes from (``RedisHeartbeats``)."""

    async def read_all(self, ttl_s: int = ...) -> list[HeartbeatRecord]: ...


def default_who() -> str:
    """``user@host``: who a change from this process is recorded as, unless told."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary UID)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def agreement_refusal(report: ShadowReport | None, version: str, stable: str,
                      threshold: float | None, doing: str) -> str | None:
    """Why ``version`` may not be made canary or promoted (``doing``): its recorded shadow
    arg-max agreement with ``stable`` is below ``threshold``. None when allowed: no
    threshold, or no comparison of this version against this stable recorded."""
    if (threshold is None or report is None or report.compared == 0
            or (report.shadow, report.stable) != (version, stable)):
        return None
    rate = report.agree / report.compared
    if rate >= threshold:
        return None
    return (f"refusing to {doing}: its recorded shadow arg-max agreement with stable "
            f"{stable!r} is {rate:.2%} over {report.compared} compared requests (epoch "
            f"{report.epoch}), below the guard's {threshold:.2%} (--guard-agreement); "
            "--force (force=True) overrides")


def role_of(policy: RolloutPolicy, label: str) -> str | None:
    """The role a version plays under a policy: stable, canary, shadow, or None (idle)."""
    for role, holder in (("stable", policy.stable), ("canary", policy.canary),
                         ("shadow", policy.shadow)):
        if holder == label:
            return role
    return None


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """One model's rollout as an operator sees it. ``stats`` is None when no worker has
    published any for the versions involved (workers without rollout stats, or idle).
    ``epochs`` is the policy epoch each live worker reports in its heartbeat (None: it
    reports none for this model). ``beating`` names the workers whose heartbeat is
    fresh (``LIVE_WITHIN_S``); None when heartbeats were not read, and then the
    registry's served entries (refreshed by the same beat, trusted for 30 s) decide."""

    record: ModelRecord
    history: list[PolicyChange]
    stats: dict[str, VersionStats] | None
    at: float
    epochs: dict[str, int | None]
    beating: frozenset[str] | None = None

    @property
    def converged(self) -> bool:
        """Every live worker serving the model routes by the current policy."""
        return all(self.epochs.get(w) == self.policy.epoch for w in self.workers())

    @property
    def policy(self) -> RolloutPolicy:
        return self.record.policy

    def workers(self) -> dict[str, list[str]]:
        """Live workers and the version labels each holds: serving the model, and beating
        (a SIGKILLed worker drops out two missed beats after its last one)."""
        beating = self.beating
        return {w: list(s.labels) for w, s in sorted(self.record.served.items())
                if s.live(self.at) and (beating is None or w in beating)}

    def to_json(self) -> dict[str, Any]:
        """The ``rollout status --json`` and ``GET …/rollout`` body."""
        labels = sorted(set(self.record.versions) | set(self.policy.labels))
        return {
            "model": self.record.name,
            "policy": self.policy.to_wire(),
            "versions": {label: {
                "role": role_of(self.policy, label),
                "version": v.version if (v := self.record.versions.get(label)) else None,
                "workers": sorted(w for w, held in self.workers().items() if label in held),
                "stats": (None if self.stats is None or label not in self.stats
                          else self.stats[label].to_json()),
            } for label in labels},
            "workers": {w: {"labels": held, "epoch": self.epochs.get(w)}
                        for w, held in self.workers().items()},
            "converged": self.converged,
            "stats_available": self.stats is not None,
            "history": [h.to_wire() for h in self.history],
        }


class Rollouts:
    """The rollout operations over a registry and, when given, a stats reader."""

    def __init__(self, registry: ModelRegistry, stats: VersionStatsReader | None = None,
                 heartbeats: HeartbeatReader | None = None, *,
                 owned: RedisModelRegistry | None = None) -> None:
        self.registry = registry
        self._stats = stats
        self._heartbeats = heartbeats
        self._owned = owned

    async def close(self) -> None:
        """Closes the connection only if :func:`open_rollouts` opened it."""
        if self._owned is not None:
            await self._owned.close()

    async def set(self, model: str, *, stable: str, canary: str | None = None,
                  percent: float = 0.0, shadow: str | None = None,
                  guard: GuardThresholds | None = None, who: str, why: str = "",
                  force: bool = False) -> RolloutPolicy:
        """Replace the policy; ValidationError names what is wrong (an unknown version,
        a percent without a canary, a new canary below the agreement threshold unless
        ``force``, …) and nothing is written then."""
        if canary is not None and not force:
            record = await self.registry.get(model)
            old = record.policy if record is not None else RolloutPolicy()
            if canary != old.canary:
                threshold = (guard or old.guard).agreement
                await self._check_agreement(model, canary, stable, threshold,
                                            f"make {canary!r} the canary")
        return await self.registry.set_policy(model, stable=stable, canary=canary,
                                              percent=percent, shadow=shadow, guard=guard,
                                              who=who, why=why)

    async def promote(self, model: str, *, who: str, why: str = "",
                      force: bool = False) -> RolloutPolicy:
        """The canary becomes stable; refused below the agreement threshold unless
        ``force`` (and, as ever, without a canary)."""
        if not force:
            record = await self.registry.get(model)
            old = record.policy if record is not None else RolloutPolicy()
            if old.canary is not None:
                await self._check_agreement(model, old.canary, old.stable,
                                            old.guard.agreement, f"promote {old.canary!r}")
        return await self.registry.promote(model, who=who, why=why)

    async def _check_agreement(self, model: str, version: str, stable: str,
                               threshold: float | None, doing: str) -> None:
        if threshold is None or self._stats is None:
            return
        report = await self._stats.read_comparisons(model)
        if (why := agreement_refusal(report, version, stable, threshold, doing)) is not None:
            raise ValidationError(why)

    async def rollback(self, model: str, *, who: str, why: str = "") -> RolloutPolicy:
        return await self.registry.rollback(model, who=who, why=why)

    async def status(self, model: str, history: int = STATUS_HISTORY) -> RolloutStatus:
        """Policy, history and per-version stats; UnknownModelError for an unknown model."""
        record = await self.registry.get(model)
        if record is None:
            raise UnknownModelError(f"model {model!r} is not in the registry")
        changes = await self.registry.history(model, history)
        stats: dict[str, VersionStats] | None = None
        if self._stats is not None:
            labels = set(record.versions) | set(record.policy.labels)
            read = await self._stats.read_versions(model, labels)
            found = {label: s for label, s in read.items() if s.roles}
            stats = found or None
        epochs: dict[str, int | None] = {}
        beating = None
        if self._heartbeats is not None:
            # the heartbeat set's scores are the beats' times: two round trips, no scan
            epochs = {h.worker_id: h.policy_epochs.get(model)
                      for h in await self._heartbeats.read_all(LIVE_WITHIN_S)
                      if h.worker_id in record.served}
            beating = frozenset(epochs)
        return RolloutStatus(record, changes, stats, time.time(), epochs, beating)


def open_rollouts(url: str, names: Names) -> Rollouts:
    """On a connection of its own (the CLI, scripts); :meth:`Rollouts.close` closes it."""
    from batchfleet.connectors.redis_client import names_for, redis_client

    client, names = redis_client(url), names_for(url, names)
    registry = RedisModelRegistry(client, names, owns_client=True)
    return Rollouts(registry, RedisRolloutStats(client, names), RedisHeartbeats(client, names),
                    owned=registry)
