"""``memory://`` twins of the Redis-only seams: cancels and lane purges, quotas, bulk
jobs and the fleet reader (routes, rollout stats and rollouts: ``memory_rollout``). Same
public methods as the Redis classes (``request_control``, ``quotas``, ``bulk_jobs``,
``fleet``); where a Redis class's logic is pure over a narrower seam it is reused as is
(``RequestControl``'s cancel rounds, ``fleet.summarize``)."""

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
from batchfleet.schemas.names import LANES


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
