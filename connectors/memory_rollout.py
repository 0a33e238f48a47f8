"""``memory://`` twins of the rollout seams: routes (each request's first routing choice),
rollout stats (per-epoch counters and capped sample lists, as ``rollout_stats._FLUSH``
merges them) and rollouts (``rollout.Rollouts`` itself, over the memory seams)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from batchfleet.connectors.memory_registry import MemoryModelRegistry
from batchfleet.connectors.memory_seams import MemoryHeartbeats
from batchfleet.connectors.memory_state import MemoryState
from batchfleet.connectors.rollout import Rollouts
from batchfleet.connectors.rollout_stats import (
    SAMPLE_CAP,
    ComparisonDelta,
    Histogram,
    ShadowReport,
    VersionDelta,
    VersionStats,
    decode_version_stats,
)
from batchfleet.connectors.routes import RouteTable, route_table


class MemoryRoutes:
    """``RoutePlane``: each request's first routing choice is the one every copy takes."""

    def __init__(self, state: MemoryState, ttl_s: int = 24 * 3600) -> None:
        self._state = state
        self._ttl_s = max(1, int(ttl_s))

    async def tables(self, models: Sequence[str], now: float | None = None
                     ) -> dict[str, RouteTable]:
        now = time.time() if now is None else now
        hashes = self._state.setdefault("models", dict)
        out: dict[str, RouteTable] = {}
        for model in models:
            with self._state.lock:
                fields = dict(hashes.get(model, {}))
            if (table := route_table(model, fields, now)) is not None:
                out[model] = table
        return out

    async def settle(self, model: str, choices: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._state.lock:
            for rid, label in choices.items():
                key = f"route:{model}:{rid}"
                found = self._state.get(key)
                if found is None:
                    self._state.set(key, label, self._ttl_s)
                    found = label
                out[rid] = found
        return out


class MemoryRolloutStats:
    """``RedisRolloutStats``: per-epoch merged counters, sample lists capped at SAMPLE_CAP."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._hashes: dict[str, dict[str, Any]] = state.setdefault("rollout_stats", dict)
        self._lists: dict[str, list[float]] = state.setdefault("rollout_samples", dict)

    def _flush(self, key: str, epoch: int, incr: Sequence[tuple[str, float]],
               maxes: Sequence[tuple[str, float]] = (), sets: Sequence[tuple[str, str]] = (),
               lists: Mapping[str, Sequence[float]] | None = None) -> None:
        """What ``_FLUSH`` does: drop an older epoch's delta, reset on a newer one."""
        with self._state.lock:
            fields = self._hashes.setdefault(key, {})
            cur = int(fields.get("epoch", -1))
            if cur > epoch:
                return
            if cur < epoch:
                fields.clear()
                for name in lists or {}:
                    self._lists.pop(name, None)
                fields["epoch"] = epoch
            for f, v in incr:
                fields[f] = fields.get(f, 0) + v
            for f, v in maxes:
                fields[f] = max(float(fields.get(f, 0)), v)
            fields.update(sets)
            for name, values in (lists or {}).items():
                kept = self._lists.setdefault(name, [])
                kept[:0] = [float(v) for v in reversed(values)]
                del kept[SAMPLE_CAP:]

    async def flush_versions(self, model: str, epoch: int,
                             deltas: Mapping[tuple[str, str], VersionDelta]) -> None:
        by_label: dict[str, list[tuple[str, float]]] = {}
        for (label, role), d in deltas.items():
            incr = by_label.setdefault(label, [])
            incr += [(f"{role}:requests", d.requests), (f"{role}:errors", d.errors)]
            incr += [(f"{role}:b{b}", n) for b, n in d.latency.counts.items()]
        for label, incr in by_label.items():
            self._flush(f"{model}:stats:{label}", epoch, incr)

    async def read_versions(self, model: str, labels: Iterable[str]) -> dict[str, VersionStats]:
        out: dict[str, VersionStats] = {}
        for label in sorted(set(labels)):
            with self._state.lock:
                fields = {k: str(v) for k, v in self._hashes.get(
                    f"{model}:stats:{label}", {}).items()}
            out[label] = decode_version_stats(label, fields)
        return out

    async def flush_comparisons(self, model: str, epoch: int, d: ComparisonDelta) -> None:
        incr: list[tuple[str, float]] = [
            ("compared", d.compared), ("skipped", d.skipped), ("errors", d.errors),
            ("agree", d.agree), ("elements", d.elements), ("sum_abs", d.sum_abs)]
        incr += [(f"lat:{role}:b{b}", n) for role, h in d.latency.items()
                 for b, n in h.counts.items()]
        sets = [(k, v) for k, v in (("stable", d.stable), ("shadow", d.shadow)) if v]
        self._flush(f"{model}:shadow", epoch, incr, [("max_abs", d.max_abs)], sets, {
            f"{model}:diffs": d.diffs, f"{model}:lat:stable": d.samples["stable"],
            f"{model}:lat:shadow": d.samples["shadow"]})

    async def read_comparisons(self, model: str) -> ShadowReport | None:
        with self._state.lock:
            raw = dict(self._hashes.get(f"{model}:shadow", {}))
            diffs, lat_stable, lat_shadow = (list(self._lists.get(f"{model}:{s}", [])) for s in
                                             ("diffs", "lat:stable", "lat:shadow"))
        if not raw:
            return None
        latency = {"stable": Histogram(), "shadow": Histogram()}
        for key, value in raw.items():
            role, _, b = key.removeprefix("lat:").partition(":b")
            if key.startswith("lat:") and role in latency and b.isdigit():
                latency[role].counts[int(b)] = int(value)
        count = {k: int(raw.get(k, 0)) for k in ("compared", "skipped", "errors", "agree")}
        return ShadowReport(
            model, int(raw.get("epoch", 0)), str(raw.get("stable", "")),
            str(raw.get("shadow", "")), count["compared"], count["skipped"], count["errors"],
            count["agree"], float(raw.get("sum_abs", 0.0)), int(raw.get("elements", 0)),
            float(raw.get("max_abs", 0.0)), latency, diffs,
            {"stable": lat_stable, "shadow": lat_shadow})

    async def claim_guard(self, model: str, epoch: int, holder: str, ttl_s: int = 3600
                          ) -> bool:
        key = f"guard:{model}:{epoch}"
        with self._state.lock:
            if self._state.get(key) is not None:
                return False
            self._state.set(key, holder, ttl_s)
            return True


class MemoryRollouts(Rollouts):
    """``Rollouts`` over the memory registry, stats and heartbeats."""

    def __init__(self, state: MemoryState, registry: MemoryModelRegistry) -> None:
        super().__init__(registry, MemoryRolloutStats(state), MemoryHeartbeats(state))
