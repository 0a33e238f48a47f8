"""``memory://`` dead letters, undecodable letters, retry schedule, heartbeats and
result cache: the rules of their Redis twins (``dead_letters``, ``retry_schedule``,
``heartbeats``, ``result_cache``), each operation atomic under the state's lock."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from batchfleet.connectors.dead_letters import PAGE
from batchfleet.connectors.memory_state import MemoryState
from batchfleet.connectors.result_cache import decode_entry, encode_entry
from batchfleet.connectors.values import CacheEntry, DeadLetter, Lettered, Retry, Undecodable
from batchfleet.schemas.heartbeat import HeartbeatRecord, decode_heartbeat, encode_heartbeat

#: Undecodable letters kept (the oldest go first), as ``dead_letters.UNDECODABLE_MAXLEN``.
UNDECODABLE_MAXLEN = 100_000


def _entry_id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class MemoryDeadLetters:
    """Per-model dead-letter lists; one letter per (request ID, generation)."""

    def __init__(self, state: MemoryState, record_ttl_s: int,
                 registry_names: Callable[[], Awaitable[set[str]]] | None = None) -> None:
        """``registry_names``: the registered models, which :meth:`models` lists too (as
        ``DeadLetterQueue.models`` does)."""
        self._state = state
        self._ttl_s = record_ttl_s
        self._registry_names = registry_names
        self._letters: dict[str, dict[tuple[int, int], DeadLetter]] = state.setdefault(
            "dlq", dict)
        self._models: set[str] = state.setdefault("dlq:_models", set)

    async def add(self, letters: Sequence[DeadLetter]) -> list[Lettered]:
        out: list[Lettered] = []
        s = self._state
        with s.lock:
            for dl in letters:
                rec = s.record(dl.request_id) or {}
                if dl.generation < int(rec.get("gen", 0)):
                    out.append(Lettered.STALE)
                elif int(rec.get("dlq", -1)) >= dl.generation or \
                        rec.get("status") not in (None, "pending"):
                    out.append(Lettered.KNOWN)
                else:
                    key = s.next_id()
                    self._letters.setdefault(dl.model, {})[key] = replace(
                        dl, entry_id=_entry_id(key), errors=list(dl.errors))
                    self._models.add(dl.model)
                    s.touch(dl.request_id)["dlq"] = dl.generation
                    s.expire_if_none(dl.request_id, self._ttl_s)
                    out.append(Lettered.ADDED)
        return out

    async def models(self) -> list[str]:
        found = set(self._models)
        if self._registry_names is not None:
            found |= await self._registry_names()
        with self._state.lock:
            return sorted(m for m in found if self._letters.get(m))

    async def pages(self, model: str, page: int = PAGE, after: str = ""
                    ) -> AsyncIterator[list[DeadLetter]]:
        start = _parse_id(after) if after else (-1, -1)
        while True:
            with self._state.lock:
                batch = [dl for key, dl in sorted(self._letters.get(model, {}).items())
                         if key > start][:page]
            if not batch:
                return
            yield batch
            if len(batch) < page:
                return
            start = _parse_id(batch[-1].entry_id)

    async def newest(self, model: str, count: int, before: str = "") -> list[DeadLetter]:
        end = _parse_id(before) if before else None
        with self._state.lock:
            found = [dl for key, dl in sorted(self._letters.get(model, {}).items(),
                                              reverse=True) if end is None or key < end]
        return found[:count]

    async def list(self, model: str) -> list[DeadLetter]:
        return [dl async for batch in self.pages(model) for dl in batch]

    async def size(self, model: str) -> int:
        with self._state.lock:
            return len(self._letters.get(model, {}))

    async def sizes(self, models: Sequence[str]) -> dict[str, int]:
        with self._state.lock:
            return {m: len(self._letters.get(m, {})) for m in models}

    async def remove(self, letters: Sequence[DeadLetter]) -> int:
        n = 0
        with self._state.lock:
            for dl in letters:
                if not dl.entry_id:
                    continue
                if self._letters.get(dl.model, {}).pop(_parse_id(dl.entry_id), None):
                    n += 1
        return n

    async def purge(self, model: str) -> int:
        with self._state.lock:
            return len(self._letters.pop(model, {}))


class MemoryUndecodable:
    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self.items: list[tuple[Undecodable, float]] = state.setdefault("dlq:_undecodable", list)

    async def add(self, items: Sequence[Undecodable]) -> None:
        now = time.time()
        with self._state.lock:
            self.items.extend((item, now) for item in items)
            del self.items[:max(0, len(self.items) - UNDECODABLE_MAXLEN)]

    async def size(self) -> int:
        with self._state.lock:
            return len(self.items)


class MemoryRetrySchedule:
    """Envelopes scored by due time; claiming leases them ``lease_s`` ahead."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._due: dict[bytes, float] = state.setdefault("retry", dict)

    async def add(self, items: Sequence[tuple[float, bytes]]) -> None:
        with self._state.lock:
            for due, envelope in items:
                self._due[envelope] = float(due)

    async def add_live(self, retries: Sequence[Retry]) -> list[bool]:
        out: list[bool] = []
        with self._state.lock:
            for r in retries:
                rec = self._state.record(r.request_id) or {}
                if rec.get("status") not in (None, "pending") or \
                        r.generation < int(rec.get("gen", 0)):
                    out.append(False)
                else:
                    self._due[r.envelope] = float(r.due)
                    out.append(True)
        return out

    async def claim_due(self, now: float, limit: int = 500, lease_s: float = 30.0
                        ) -> list[bytes]:
        with self._state.lock:
            due = sorted((score, env) for env, score in self._due.items() if score <= now)
            claimed = [env for _, env in due[:limit]]
            for env in claimed:
                self._due[env] = now + lease_s
        return claimed

    async def done(self, envelopes: Sequence[bytes]) -> None:
        with self._state.lock:
            for env in envelopes:
                self._due.pop(env, None)

    async def next_due(self) -> float | None:
        with self._state.lock:
            return min(self._due.values(), default=None)

    async def size(self) -> int:
        with self._state.lock:
            return len(self._due)


class MemoryHeartbeats:
    """Each worker's beat with its TTL, plus the last-beat scores readers filter on."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._live: dict[str, float] = state.setdefault("live_workers", dict)

    async def write(self, worker_id: str, info: Mapping[str, Any], ttl_s: int) -> bool:
        now = time.time()
        key = "heartbeat:" + worker_id
        with self._state.lock:
            previous = self._state.get(key)
            self._state.set(key, encode_heartbeat(info), ttl_s)
            self._live[worker_id] = now
            for w in [w for w, at in self._live.items() if at <= now - ttl_s]:
                del self._live[w]
        return previous is not None

    async def read_all(self, ttl_s: int = 10) -> list[HeartbeatRecord]:
        since = time.time() - ttl_s
        with self._state.lock:
            raws = [self._state.get("heartbeat:" + w) for w, at in sorted(
                self._live.items(), key=lambda item: item[1]) if at >= since]
        records = (decode_heartbeat(raw) for raw in raws if raw)
        return [r for r in records if r is not None]

    async def forget(self, worker_id: str) -> None:
        with self._state.lock:
            self._state.kv.pop("heartbeat:" + worker_id, None)
            self._live.pop(worker_id, None)

    def present(self, worker_id: str) -> bool:
        """Whether the worker's beat is still there (``HeartbeatProbe.present``)."""
        with self._state.lock:
            return self._state.get("heartbeat:" + worker_id) is not None


class MemoryResultCache:
    """Entries stored encoded, as on Redis, so a malformed one reads as a miss there too."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def get_many(self, digests: Sequence[str]) -> list[CacheEntry | None]:
        with self._state.lock:
            raws = [self._state.get("cache:" + d) for d in digests]
        return [decode_entry(r) if isinstance(r, bytes) else None for r in raws]

    async def put_many(self, entries: Sequence[tuple[str, CacheEntry]], ttl_s: int) -> None:
        if ttl_s <= 0:
            return
        encoded = [(d, encode_entry(e)) for d, e in entries]
        with self._state.lock:
            for digest, raw in encoded:
                self._state.set("cache:" + digest, raw, ttl_s)
