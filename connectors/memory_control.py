"""``memory://`` twins of the Redis-only seams: cancels and lane purges, routes, rollout
stats, rollouts, quotas, bulk jobs and the fleet reader. Same public methods as the Redis
classes (``request_control``, ``routes``, ``rollout_stats``, ``rollout``, ``quotas``,
``bulk_jobs``, ``fleet``); where a Redis class's logic is pure over a narrower seam it is
reused as is (``RequestControl``'s cancel rounds, ``Rollouts``, ``summarize``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from batchfleet.connectors.fleet import (
    HEARTBEAT_TTL_S,
    FleetSnapshot,
    StreamStats,
    summarize,
    worker_view,
)
from batchfleet.connectors.memory_registry import MemoryModelRegistry
from batchfleet.connectors.memory_results import MemoryResults
from batchfleet.connectors.memory_seams import (
    MemoryDeadLetters,
    MemoryHeartbeats,
    MemoryUndecodable,
)
from batchfleet.connectors.memory_state import MemoryState, Stream
from batchfleet.connectors.quotas import Admission, Quota
from batchfleet.connectors.request_control import (
    CANCEL_SET_KEEP_S,
    PurgeReport,
    RequestControl,
    _peek_id,
)
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
from batchfleet.connectors.routes import RouteTable
from batchfleet.schemas.errors import ResultStoreError, ValidationError
from batchfleet.schemas.names import LANES
from batchfleet.schemas.registry import decode_record


class MemoryCancels(RequestControl):
    """Cancel and purge (``RequestControl``) plus the worker's cancel set (``CancelSet``)."""

    def __init__(self, state: MemoryState, results: MemoryResults) -> None:
        # RequestControl's cancel rounds use only cancel_views and write_terminal
        self._store = results  # type: ignore[assignment]
        self._state = state
        self._undecodable = MemoryUndecodable(state)  # type: ignore[assignment]
        self._lanes = None
        self._set: dict[str, float] = state.setdefault("cancelled", dict)

    async def close(self) -> None:
        return None

    async def _add_to_set(self, ids: Sequence[str]) -> None:
        now = time.time()
        with self._state.lock:
            self._set.update(dict.fromkeys(ids, now))
            for rid in [r for r, at in self._set.items() if at <= now - CANCEL_SET_KEEP_S]:
                del self._set[rid]

    async def _held(self, models: Iterable[str], wanted: set[str]) -> set[str]:
        held: set[str] = set()
        with self._state.lock:
            for (model, _), stream in self._state.streams.items():
                if model not in models:
                    continue
                for group in stream.groups.values():
                    for key in group.pending:
                        rid = _peek_id(stream.entries.get(key, b""))
                        if rid in wanted:
                            held.add(rid)
        return held

    async def size(self) -> int:
        with self._state.lock:
            return len(self._set)

    async def take(self, request_ids: Sequence[str]) -> set[str]:
        with self._state.lock:
            return {rid for rid in dict.fromkeys(request_ids) if self._set.pop(rid, None)}

    async def lane_depths(self, model: str, lanes: Sequence[str]) -> dict[str, int]:
        with self._state.lock:
            return {lane: len(self._state.streams.get((model, lane), Stream()).entries)
                    for lane in lanes}

    async def purge_lane(self, model: str, lane: str) -> PurgeReport:
        """Answer ``cancelled`` for every entry no consumer holds, then delete those."""
        report = PurgeReport(model)
        with self._state.lock:
            stream = self._state.streams.get((model, lane), Stream())
            held = {k for g in stream.groups.values() for k in g.pending}
            free = [(k, p) for k, p in stream.entries.items() if k not in held]
        report.held = len(stream.entries) - len(free)
        await self._purge_page(model, lane, [(k, {b"p": p}) for k, p in free], report)
        with self._state.lock:
            for key, _ in free:
                stream.entries.pop(key, None)
        return report


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
            try:
                record = decode_record(model, fields)
            except ValidationError as exc:
                raise ResultStoreError(f"the model registry holds a malformed record: {exc}"
                                       ) from exc
            if record is None:
                continue
            held = frozenset(label for s in record.served.values() if s.live(now)
                             for label in s.labels)
            out[model] = RouteTable(record.policy, frozenset(record.versions), held)
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


class MemoryQuotas:
    """``QuotaGate``: a token bucket and an in-flight set per owner; a won terminal write
    frees the slot (``MemoryResults.write_terminal``), as on Redis."""

    def __init__(self, state: MemoryState, hold_s: float = 24 * 3600 + 60.0) -> None:
        self._state = state
        self._hold_s = hold_s
        self._buckets: dict[str, tuple[float, float]] = state.setdefault("quota", dict)

    async def admit(self, owner: str, quota: Quota, request_ids: Sequence[str]) -> Admission:
        rate, burst = quota.rate_per_s, quota.bucket
        most, n = quota.max_in_flight, len(request_ids)
        now = time.time()
        with self._state.lock:
            tokens = float(burst)
            if rate > 0 and owner in self._buckets:
                had, at = self._buckets[owner]
                tokens = min(burst, had + max(0.0, now - at) * rate)
            slots = self._state.inflight.setdefault(owner, {})
            for rid in [r for r, until in slots.items() if until <= now]:
                del slots[rid]
            inflight = len(slots) if most > 0 else 0
            if (rate > 0 and n > burst) or (most > 0 and n > most):
                return Admission(-2, tokens, inflight, 0.0)
            if most > 0 and inflight + n > most:
                return Admission(-1, tokens, inflight, 1.0)
            if rate > 0 and tokens < n:
                return Admission(0, tokens, inflight, (n - tokens) / rate)
            if rate > 0:
                tokens -= n
                self._buckets[owner] = (tokens, now)
            if most > 0:
                slots.update(dict.fromkeys(request_ids, now + self._hold_s))
                inflight = len(slots)
            return Admission(1, tokens, inflight, 0.0)

    async def release(self, owner: str, request_ids: Sequence[str]) -> None:
        with self._state.lock:
            slots = self._state.inflight.get(owner, {})
            for rid in request_ids:
                slots.pop(rid, None)


class MemoryBulkJobs:
    """``BulkJobStore``: job fields, a lease with a TTL, an index by creation time."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._jobs: dict[str, dict[str, str]] = state.setdefault("bulk_jobs", dict)
        self._index: dict[str, float] = state.setdefault("bulk_index", dict)
        self._shards: dict[str, dict[str, float]] = state.setdefault("bulk_shards", dict)

    def _lease(self, job_id: str) -> str | None:
        found = self._state.get("bulk_lease:" + job_id)
        return None if found is None else str(found)

    async def take_lease(self, job_id: str, token: str, ttl_s: int) -> str | None:
        with self._state.lock:
            holder = self._lease(job_id)
            if holder is None:
                self._state.set("bulk_lease:" + job_id, token, ttl_s)
            return holder

    async def steal_lease(self, job_id: str, holder: str, token: str, ttl_s: int) -> bool:
        with self._state.lock:
            if self._lease(job_id) != holder:
                return False
            self._state.set("bulk_lease:" + job_id, token, ttl_s)
            return True

    async def release_lease(self, job_id: str, token: str) -> None:
        with self._state.lock:
            if self._lease(job_id) == token:
                self._state.kv.pop("bulk_lease:" + job_id, None)

    async def fields(self, job_id: str) -> dict[str, str]:
        with self._state.lock:
            return dict(self._jobs.get(job_id, {}))

    async def read(self, job_id: str) -> tuple[dict[str, str], str | None]:
        with self._state.lock:
            return dict(self._jobs.get(job_id, {})), self._lease(job_id)

    def _set(self, job_id: str, fields: Mapping[str, Any]) -> None:
        self._jobs.setdefault(job_id, {}).update(
            {k: "" if v is None else str(v) for k, v in fields.items()})

    async def create(self, job_id: str, fields: Mapping[str, Any], created_at: float) -> None:
        with self._state.lock:
            self._set(job_id, fields)
            self._index[job_id] = created_at

    async def fenced_write(self, job_id: str, token: str, fields: Mapping[str, Any],
                           lease_ttl_s: int, job_ttl_s: int) -> int:
        with self._state.lock:
            if self._lease(job_id) != token:
                return -1
            self._state.set("bulk_lease:" + job_id, token, lease_ttl_s)
            self._set(job_id, fields)
            return int(self._jobs[job_id].get("cancel") or 0)

    async def write(self, job_id: str, fields: Mapping[str, Any]) -> None:
        with self._state.lock:
            self._set(job_id, fields)

    async def recent(self, limit: int) -> list[str]:
        with self._state.lock:
            ordered = sorted(self._index.items(), key=lambda item: (item[1], item[0]),
                             reverse=True)
        return [job for job, _ in ordered[:max(0, limit)]]

    async def index_shard(self, job_id: str, record_id: str, started_at: float,
                          ttl_s: int) -> None:
        with self._state.lock:
            self._shards.setdefault(job_id, {}).setdefault(record_id, started_at)

    async def shards_of(self, job_id: str) -> list[str]:
        with self._state.lock:
            found = self._shards.get(job_id, {})
            return sorted(found, key=lambda r: (found[r], r))

    async def unindex(self, job_ids: Sequence[str]) -> None:
        with self._state.lock:
            for job in job_ids:
                self._index.pop(job, None)

    async def close(self) -> None:
        return None


class MemoryFleet:
    """``FleetReader``: heartbeats, registry, dead letters and lanes in one snapshot."""

    def __init__(self, heartbeats: MemoryHeartbeats, models: MemoryModelRegistry,
                 letters: MemoryDeadLetters) -> None:
        self._heartbeats, self._models, self._letters = heartbeats, models, letters
        self._state: MemoryState = models._state

    async def close(self) -> None:
        return None

    async def read(self) -> FleetSnapshot:
        now = time.time()
        workers = [worker_view(r, now) for r in await self._heartbeats.read_all(HEARTBEAT_TTL_S)]
        models = await self._models.names()
        sizes = {m: n for m, n in (await self._letters.sizes(
            sorted(models | set(await self._letters.models())))).items() if n}
        every = sorted({*models, *sizes, *(m for w in workers for m in w.models)})
        streams: dict[tuple[str, str], StreamStats] = {}
        group = f"{self._state.namespace}-workers"
        with self._state.lock:
            for model in every:
                for lane in LANES:
                    stream = self._state.streams.get((model, lane), Stream())
                    first = next(iter(stream.entries), None)
                    age = max(0.0, now - first[0] / 1000.0) if first else None
                    g = stream.groups.get(group)
                    lag = None if g is None else sum(1 for k in stream.entries if k > g.last)
                    streams[(model, lane)] = StreamStats(
                        len(stream.entries), age, lag, None if g is None else len(g.pending))
        undecodable = await MemoryUndecodable(self._state).size()
        retries = len(self._state.setdefault("retry", dict))
        # "redis": the memory broker's lanes are streams, read like Redis's
        return summarize("redis", self._state.namespace, models, workers, streams, sizes,
                         undecodable, retries, now)
