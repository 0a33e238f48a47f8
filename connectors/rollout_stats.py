"""Per-version stats and shadow comparisons, merged across workers in Redis.

Workers accumulate both in memory and flush a delta every few seconds, so the cost
is a round trip per model per flush, never per request. Everything merges by
addition: counters by ``HINCRBY``/``HINCRBYFLOAT``, latency as a fixed-bucket
histogram (:data:`LATENCY_BOUNDS_MS`), so p50/p99 over the whole fleet are exact
to a bucket whatever number of workers wrote them. Both records belong to one
policy epoch: a flush for a newer epoch starts them afresh (the guard and
``rollout report`` judge a rollout over its own traffic), a flush for an older
one is dropped (a worker that has not seen the change yet). Keys hang off the
model's registry hash, ``{ns}:model:{name}``:

* ``:stats:{label}`` — hash ``epoch``, ``{role}:requests``, ``{role}:errors``,
  ``{role}:b{i}`` (compute-latency bucket counts; one per computed batch);
* ``:shadow`` — hash of comparison counters, labels and both versions' buckets;
* ``:shadow:diffs``, ``:shadow:lat:{stable|shadow}`` — bounded sample lists for the plot;
* ``:guard:{epoch}`` — the one worker allowed to act on that epoch (``SET NX``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import queue_script
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names
from batchfleet.schemas.tensors import Tensors

#: Upper bounds (ms) of the latency buckets: 0.05 ms up by 25% a step to about a minute;
#: one more bucket holds everything slower. Percentiles are read as a bucket's upper bound.
LATENCY_BOUNDS_MS: Final = tuple(round(0.05 * 1.25 ** i, 4) for i in range(64))
#: How many recent diffs and latencies the plot keeps per model.
SAMPLE_CAP: Final = 2000
#: Stats outlive their last flush by this long (a model gone quiet stops costing memory).
STATS_TTL_S: Final = 7 * 24 * 3600
ROLES: Final = ("stable", "canary", "shadow", "pinned")

#: KEYS[1] the hash, KEYS[2..] sample lists. ARGV: epoch, ttl, cap, then four groups
#: (HINCRBY, HINCRBYFLOAT, max, HSET), each a count n and n field/value pairs, then per
#: list a count and its values. 0: dropped (the hash belongs to a newer epoch), 1: merged.
_FLUSH = """
local epoch = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
if cur > epoch then return 0 end
if cur < epoch then
  for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
local at = 4
for group = 1, 4 do
  local n = tonumber(ARGV[at]); at = at + 1
  for _ = 1, n do
    local f, v = ARGV[at], ARGV[at + 1]; at = at + 2
    if group == 1 then redis.call('HINCRBY', KEYS[1], f, v)
    elseif group == 2 then redis.call('HINCRBYFLOAT', KEYS[1], f, v)
    elseif group == 3 then
      local old = tonumber(redis.call('HGET', KEYS[1], f) or '0')
      if tonumber(v) > old then redis.call('HSET', KEYS[1], f, v) end
    else redis.call('HSET', KEYS[1], f, v) end
  end
end
for i = 2, #KEYS do
  local n = tonumber(ARGV[at]); at = at + 1
  if n > 0 then
    redis.call('LPUSH', KEYS[i], unpack(ARGV, at, at + n - 1))
    redis.call('LTRIM', KEYS[i], 0, tonumber(ARGV[3]) - 1)
  end
  at = at + n
end
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return 1
"""


# --- latency histograms (pure) ----------------------------------------------------------


def bucket_of(ms: float) -> int:
    """The bucket holding ``ms`` (the last one past the largest bound)."""
    return bisect.bisect_left(LATENCY_BOUNDS_MS, ms)


def bound_of(bucket: int) -> float:
    """A bucket's upper bound in ms (the overflow bucket reads as infinity)."""
    return LATENCY_BOUNDS_MS[bucket] if bucket < len(LATENCY_BOUNDS_MS) else math.inf


@dataclass(slots=True)
class Histogram:
    """Counts per bucket: adds and merges by addition, so percentiles merge exactly."""

    counts: dict[int, int] = field(default_factory=dict)

    def add(self, ms: float, n: int = 1) -> None:
        b = bucket_of(ms)
        self.counts[b] = self.counts.get(b, 0) + n

    def merge(self, other: Histogram) -> None:
        for b, n in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (0 < q <= 1)."""
        total = self.total
        if total == 0:
            return None
        rank, seen = max(1, math.ceil(q * total)), 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return bound_of(b)
        return bound_of(max(self.counts))  # unreachable: seen reaches total

    def cdf(self) -> list[tuple[float, float]]:
        """(bound ms, share at or below it), for the latency CDF plot."""
        total, seen, out = self.total, 0, []
        for b in sorted(self.counts):
            seen += self.counts[b]
            out.append((bound_of(b), seen / total))
        return out


# --- per-version stats ------------------------------------------------------------------


@dataclass(slots=True)
class VersionDelta:
    """What one worker saw of one (label, role) since its last flush."""

    requests: int = 0
    errors: int = 0
    latency: Histogram = field(default_factory=Histogram)

    def add_batch(self, size: int, errors: int, compute_ms: float) -> None:
        self.requests += size
        self.errors += errors
        self.latency.add(compute_ms)


@dataclass(frozen=True, slots=True)
class RoleStats:
    """One version's merged numbers in one role, since the policy epoch began."""

    requests: int
    errors: int
    latency: Histogram

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": round(self.error_rate, 6),
                "p50_compute_ms": self.latency.percentile(0.5),
                "p99_compute_ms": self.latency.percentile(0.99)}


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One version's merged stats per role (a label changes role on promote)."""

    label: str
    epoch: int | None
    roles: dict[str, RoleStats]

    def role(self, role: str) -> RoleStats:
        return self.roles.get(role) or RoleStats(0, 0, Histogram())

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "epoch": self.epoch,
                "roles": {r: s.to_json() for r, s in sorted(self.roles.items())}}


def decode_version_stats(label: str, fields: Mapping[Any, Any]) -> VersionStats:
    raw = {_text(k): _text(v) for k, v in fields.items()}
    epoch = int(raw.pop("epoch")) if "epoch" in raw else None
    parts: dict[str, tuple[int, int, Histogram]] = {}
    for key, value in raw.items():
        role, _, what = key.partition(":")
        requests, errors, hist = parts.setdefault(role, (0, 0, Histogram()))
        if what == "requests":
            parts[role] = (int(value), errors, hist)
        elif what == "errors":
            parts[role] = (requests, int(value), hist)
        elif what.startswith("b") and what[1:].isdigit():
            hist.counts[int(what[1:])] = int(value)
    return VersionStats(label, epoch, {r: RoleStats(*p) for r, p in parts.items()})


# --- shadow comparisons -----------------------------------------------------------------


def flat(outputs: Tensors) -> np.ndarray[Any, np.dtype[np.float64]]:
    """One request's outputs as a flat float vector (named tensors in name order)."""
    if isinstance(outputs, dict):
        parts = [np.asarray(outputs[k], dtype=np.float64).ravel() for k in sorted(outputs)]
        return np.concatenate(parts) if parts else np.zeros(0)
    return np.asarray(outputs, dtype=np.float64).ravel()


@dataclass(frozen=True, slots=True)
class Difference:
    """How far one request's shadow output is from its stable output."""

    max_abs: float
    sum_abs: float
    elements: int
    argmax_agrees: bool


def compare_outputs(stable: Tensors, shadow: Tensors) -> Difference | None:
    """Element-wise difference; None when the outputs cannot be compared (another size)."""
    a, b = flat(stable), flat(shadow)
    if a.shape != b.shape:
        return None
    if a.size == 0:
        return Difference(0.0, 0.0, 0, True)
    diff = np.abs(a - b)
    return Difference(float(diff.max()), float(diff.sum()), int(a.size),
                      int(np.argmax(a)) == int(np.argmax(b)))


@dataclass(slots=True)
class ComparisonDelta:
    """One worker's comparisons of one model since its last flush."""

    stable: str = ""
    shadow: str = ""
    compared: int = 0
    skipped: int = 0
    errors: int = 0
    agree: int = 0
    sum_abs: float = 0.0
    elements: int = 0
    max_abs: float = 0.0
    latency: dict[str, Histogram] = field(
        default_factory=lambda: {"stable": Histogram(), "shadow": Histogram()})
    diffs: list[float] = field(default_factory=list)
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {"stable": [], "shadow": []})

    def add(self, d: Difference) -> None:
        self.compared += 1
        self.agree += d.argmax_agrees
        self.sum_abs += d.sum_abs
        self.elements += d.elements
        self.max_abs = max(self.max_abs, d.max_abs)
        if len(self.diffs) < SAMPLE_CAP:
            self.diffs.append(d.max_abs)

    def add_latency(self, role: str, ms: float) -> None:
        self.latency[role].add(ms)
        if len(self.samples[role]) < SAMPLE_CAP:
            self.samples[role].append(ms)

    @property
    def empty(self) -> bool:
        return not (self.compared or self.skipped or self.errors
                    or any(h.counts for h in self.latency.values()))


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """The merged comparisons of one model (``rollout report``)."""

    model: str
    epoch: int
    stable: str
    shadow: str
    compared: int
    skipped: int
    errors: int
    agree: int
    sum_abs: float
    elements: int
    max_abs: float
    latency: dict[str, Histogram]
    diffs: list[float]
    samples: dict[str, list[float]]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "epoch": self.epoch, "stable": self.stable,
            "shadow": self.shadow, "compared": self.compared, "skipped": self.skipped,
            "errors": self.errors,
            "agreement_rate": round(self.agree / self.compared, 6) if self.compared else None,
            "max_abs_diff": self.max_abs if self.compared else None,
            "mean_abs_diff": self.sum_abs / self.elements if self.elements else None,
            "latency_ms": {role: {"p50": h.percentile(0.5), "p99": h.percentile(0.99),
                                  "batches": h.total}
                           for role, h in sorted(self.latency.items())},
            "samples": len(self.diffs),
        }


# --- Redis ------------------------------------------------------------------------------


class RedisRolloutStats:
    """Flushes and reads both records; see the module docstring for the layout."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names
        self._flush = client.register_script(_FLUSH)

    def _key(self, model: str, suffix: str) -> str:
        return f"{self._names.model(model)}:{suffix}"

    @wrap_errors(ResultStoreError, "cannot write the rollout stats")
    async def flush_versions(self, model: str, epoch: int,
                             deltas: Mapping[tuple[str, str], VersionDelta]) -> None:
        """Merge one worker's per-(label, role) deltas: one script call per label."""
        by_label: dict[str, list[tuple[str, int]]] = {}
        for (label, role), d in deltas.items():
            incr = by_label.setdefault(label, [])
            incr += [(f"{role}:requests", d.requests), (f"{role}:errors", d.errors)]
            incr += [(f"{role}:b{b}", n) for b, n in d.latency.counts.items()]
        if not by_label:
            return
        pipe = self._redis.pipeline(transaction=False)
        for label, incr in by_label.items():
            await queue_script(pipe, self._flush, [self._key(model, f"stats:{label}")],
                               _args(epoch, incr, (), (), (), ()))
        await pipe.execute()

    @wrap_errors(ResultStoreError, "cannot read the rollout stats")
    async def read_versions(self, model: str, labels: Iterable[str]) -> dict[str, VersionStats]:
        """Each label's merged stats, in one round trip."""
        ordered = sorted(set(labels))
        pipe = self._redis.pipeline(transaction=False)
        for label in ordered:
            pipe.hgetall(self._key(model, f"stats:{label}"))
        rows = await pipe.execute() if ordered else []
        return {label: decode_version_stats(label, row)
                for label, row in zip(ordered, rows, strict=True)}

    @wrap_errors(ResultStoreError, "cannot write the shadow comparisons")
    async def flush_comparisons(self, model: str, epoch: int, d: ComparisonDelta) -> None:
        incr = [("compared", d.compared), ("skipped", d.skipped), ("errors", d.errors),
                ("agree", d.agree), ("elements", d.elements)]
        incr += [(f"lat:{role}:b{b}", n) for role, h in d.latency.items()
                 for b, n in h.counts.items()]
        sets = [(k, v) for k, v in (("stable", d.stable), ("shadow", d.shadow)) if v]
        keys = [self._key(model, s) for s in ("shadow", "shadow:diffs", "shadow:lat:stable",
                                               "shadow:lat:shadow")]
        lists = (d.diffs, d.samples["stable"], d.samples["shadow"])
        await self._flush(keys=keys, args=_args(epoch, incr, [("sum_abs", d.sum_abs)],
                                                [("max_abs", d.max_abs)], sets, lists))

    @wrap_errors(ResultStoreError, "cannot read the shadow comparisons")
    async def read_comparisons(self, model: str) -> ShadowReport | None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(self._key(model, "shadow"))
        for suffix in ("shadow:diffs", "shadow:lat:stable", "shadow:lat:shadow"):
            pipe.lrange(self._key(model, suffix), 0, SAMPLE_CAP - 1)
        fields, diffs, lat_stable, lat_shadow = await pipe.execute()
        if not fields:
            return None
        raw = {_text(k): _text(v) for k, v in fields.items()}
        latency = {"stable": Histogram(), "shadow": Histogram()}
        for key, value in raw.items():
            role, _, b = key.removeprefix("lat:").partition(":b")
            if key.startswith("lat:") and role in latency and b.isdigit():
                latency[role].counts[int(b)] = int(value)
        count = {k: int(raw.get(k, 0)) for k in ("compared", "skipped", "errors", "agree")}
        return ShadowReport(
            model, int(raw.get("epoch", 0)), raw.get("stable", ""), raw.get("shadow", ""),
            count["compared"], count["skipped"], count["errors"], count["agree"],
            float(raw.get("sum_abs", 0.0)), int(raw.get("elements", 0)),
            float(raw.get("max_abs", 0.0)), latency, [float(x) for x in diffs],
            {"stable": [float(x) for x in lat_stable], "shadow": [float(x) for x in lat_shadow]})

    @wrap_errors(ResultStoreError, "cannot claim the rollout guard")
    async def claim_guard(self, model: str, epoch: int, holder: str, ttl_s: int = 3600
                          ) -> bool:
        """True for the one caller that claims this policy epoch (the guard acts once)."""
        return bool(await self._redis.set(self._key(model, f"guard:{epoch}"), holder,
                                          nx=True, ex=ttl_s))


def _args(epoch: int, incr: Sequence[tuple[str, int]], floats: Sequence[tuple[str, float]],
          maxes: Sequence[tuple[str, float]], sets: Sequence[tuple[str, str]],
          lists: Sequence[Sequence[float]]) -> list[Any]:
    args: list[Any] = [epoch, STATS_TTL_S, SAMPLE_CAP]
    for group in (incr, [(k, repr(v)) for k, v in floats], [(k, repr(v)) for k, v in maxes],
                  sets):
        args.append(len(group))
        for k, v in group:
            args += [k, v]
    for values in lists:
        args.append(len(values))
        args += [repr(float(v)) for v in values]
    return args


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
