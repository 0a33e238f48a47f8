"""The result store: one Redis hash per request ID, first terminal result wins.

Each record is a hash ``{status, gen, body}`` where ``body`` is the encoded
result envelope. Writes go through Lua so that "write only if not yet
terminal" is atomic, and a whole batch is one round trip. A terminal write
also publishes the finished IDs, grouped per client channel, so waiting
clients wake up without polling: one PUBLISH per client per batch.

``gen`` is the request's generation: a DLQ replay raises it and resets the
record to ``pending``; a write from an older generation never lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.errors import ResultStoreError
from schemas.names import Names

DEFAULT_TTL_S = 24 * 3600

_PUT_PENDING = """
local ttl = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HSETNX', key, 'status', 'pending') == 1 then
    redis.call('HSET', key, 'gen', 0, 'body', ARGV[i + 1])
    redis.call('EXPIRE', key, ttl)
    out[i] = 0
  elseif redis.call('HGET', key, 'status') == 'pending' then
    out[i] = 1
  else
    out[i] = 2
  end
end
return out
"""

_WRITE_TERMINAL = """
local ttl = tonumber(ARGV[1])
local meta = cmsgpack.unpack(ARGV[2])
local out = {}
local channels = {}
for i, key in ipairs(KEYS) do
  local m = meta[i]
  local rid, status, channel, gen, body = m[1], m[2], m[3], m[4], ARGV[i + 2]
  local cur = redis.call('HMGET', key, 'status', 'gen')
  local cur_gen = tonumber(cur[2]) or 0
  if (not cur[1] or cur[1] == 'pending') and gen >= cur_gen then
    redis.call('HSET', key, 'status', status, 'gen', gen, 'body', body)
    redis.call('EXPIRE', key, ttl)
    out[i] = 1
    if channel ~= '' then
      local ids = channels[channel]
      if not ids then ids = {}; channels[channel] = ids end
      ids[#ids + 1] = rid
    end
  else
    out[i] = 0
  end
end
for channel, ids in pairs(channels) do
  redis.call('PUBLISH', channel, table.concat(ids, ','))
end
return out
"""

_COUNT_DELIVERIES = """
local ttl = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local n = math.max(tonumber(redis.call('HGET', key, 'deliveries')) or 0,
                     tonumber(ARGV[i + 1])) + 1
  redis.call('HSET', key, 'deliveries', n)
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, ttl) end
  local cur = redis.call('HMGET', key, 'solo', 'status', 'gen')
  local done = -1
  if cur[2] and cur[2] ~= 'pending' then done = tonumber(cur[3]) or 0 end
  out[i] = {n, tonumber(cur[1]) or 0, done}
end
return out
"""

#: ARGV[1] = '1': return a body only where the status is terminal (else nil).
_GET_BODIES = """
local terminal_only = ARGV[1] == '1'
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'body')
  if terminal_only and (not cur[1] or cur[1] == 'pending') then out[i] = false
  else out[i] = cur[2] end
end
return out
"""

_REOPEN = """
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'gen')
  if cur[1] == 'failed' or cur[1] == 'pending' then
    local gen = (tonumber(cur[2]) or 0) + 1
    redis.call('HSET', key, 'status', 'pending', 'gen', gen, 'deliveries', 0, 'solo', 0,
      'body', ARGV[i])
    out[i] = gen
  else
    out[i] = -1
  end
end
return out
"""


class SubmitState(IntEnum):
    """What ``put_pending`` found for each request ID."""

    NEW = 0
    #: Already submitted and not finished: publishing again is harmless (first result wins).
    PENDING = 1
    #: Already finished: a duplicate submit must not run it again.
    TERMINAL = 2


@dataclass(frozen=True, slots=True)
class TerminalWrite:
    """One terminal result ready to be stored."""

    request_id: str
    status: str
    body: bytes
    notify_channel: str | None = None
    generation: int = 0


class ResultStore:
    """Redis-backed result store keyed by request ID."""

    def __init__(self, client: aioredis.Redis, names: Names, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._redis = client
        self._names = names
        self.ttl_s = ttl_s
        self._put_pending = client.register_script(_PUT_PENDING)
        self._write_terminal = client.register_script(_WRITE_TERMINAL)
        self._count_deliveries = client.register_script(_COUNT_DELIVERIES)
        self._reopen = client.register_script(_REOPEN)
        self._get_bodies = client.register_script(_GET_BODIES)

    @property
    def redis(self) -> aioredis.Redis:
        return self._redis

    async def put_pending(self, records: Sequence[tuple[str, bytes]]) -> list[SubmitState]:
        """Create ``pending`` records for (request ID, pending body) pairs, never overwriting."""
        if not records:
            return []
        keys = [self._names.result(rid) for rid, _ in records]
        args: list[Any] = [self.ttl_s, *(body for _, body in records)]
        try:
            states = await self._put_pending(keys=keys, args=args)
        except RedisError as exc:
            raise ResultStoreError(f"cannot record pending requests: {exc}") from exc
        return [SubmitState(int(s)) for s in states]

    async def write_terminal(self, writes: Sequence[TerminalWrite]) -> list[bool]:
        """Store terminal results unless one already exists; True where this call's write won."""
        if not writes:
            return []
        keys = [self._names.result(w.request_id) for w in writes]
        # What is small goes in one msgpack argument, so a batch is N bodies plus two
        # arguments rather than 5N: redis-py packs every argument in Python.
        channel = self._names.notify_channel
        meta = msgpack.packb([
            (w.request_id, w.status, channel(w.notify_channel) if w.notify_channel else "",
             w.generation) for w in writes])
        args: list[Any] = [self.ttl_s, meta, *(w.body for w in writes)]
        try:
            won = await self._write_terminal(keys=keys, args=args)
        except RedisError as exc:
            raise ResultStoreError(f"cannot write results: {exc}") from exc
        return [bool(x) for x in won]

    async def count_deliveries(self, counted: Sequence[tuple[str, int]]
                               ) -> list[tuple[int, int, int]]:
        """Durably count one more delivery of each request: (deliveries, solo, done_gen).

        ``counted`` pairs each request ID with the deliveries known to have happened
        before this one (the count becomes at least that plus one): a transport that
        can tell a first delivery apart (Redis) skips counting those, and says so
        here when the request comes round again.

        Kept in the result record itself. More deliveries than attempts means a
        worker died holding the request; ``solo`` counts its solo runs that never
        finished (see :meth:`mark_solo`), so a request that kills every worker that
        computes it can be quarantined instead of looping forever, without blaming
        the neighbours that merely shared a batch or a buffer with it. ``done_gen``
        is the generation of its terminal result, or -1 while it has none: a
        redelivery of a finished request is acked without running it again.
        """
        if not counted:
            return []
        keys = [self._names.result(rid) for rid, _ in counted]
        try:
            pairs = await self._count_deliveries(
                keys=keys, args=[self.ttl_s, *(before for _, before in counted)])
        except RedisError as exc:
            raise ResultStoreError(f"cannot count deliveries: {exc}") from exc
        return [(int(n), int(solo), int(done)) for n, solo, done in pairs]

    async def mark_solo(self, request_id: str, started: bool, attempt: int = 1) -> None:
        """Count a suspect's solo run durably *before* it computes, and uncount it after:
        what remains counts only the runs during which the worker died. A finished solo
        run also clears the suspicion: deliveries go back to one per attempt so far."""
        key = self._names.result(request_id)
        try:
            if started:
                await self._redis.hincrby(key, "solo", 1)
            else:
                pipe = self._redis.pipeline(transaction=True)
                pipe.hincrby(key, "solo", -1)
                pipe.hset(key, "deliveries", attempt)
                await pipe.execute()
        except RedisError as exc:
            raise ResultStoreError(f"cannot record a solo run: {exc}") from exc

    async def reopen_for_replay(self, records: Sequence[tuple[str, bytes]]) -> list[int]:
        """Turn ``failed`` records back to ``pending`` under a new generation, for DLQ replay.

        ``pending`` is reopened too: it means an earlier replay stopped before it
        published. Returns the new generation per request, or -1 where the record
        is succeeded, expired or gone: those are not replayed. A late write from the
        old generation can then never land (see _WRITE_TERMINAL).
        """
        if not records:
            return []
        keys = [self._names.result(rid) for rid, _ in records]
        try:
            return [int(g) for g in await self._reopen(keys=keys, args=[b for _, b in records])]
        except RedisError as exc:
            raise ResultStoreError(f"cannot reopen results for replay: {exc}") from exc

    async def get_bodies(self, request_ids: Sequence[str], terminal_only: bool = False
                         ) -> list[bytes | None]:
        """Encoded result envelopes in one round trip; None if unknown, and with
        ``terminal_only`` also None while pending (a waiter would only decode a pending
        body to throw it away).

        One script call rather than a pipeline of HGETs: one command to pack and one
        reply to parse, however many IDs (redis-py's per-reply cost dominated).
        """
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        try:
            bodies = await self._get_bodies(keys=keys, args=[int(terminal_only)])
        except RedisError as exc:
            raise ResultStoreError(f"cannot read results: {exc}") from exc
        return [b or None for b in bodies]

    async def register_models(self, models: Sequence[str]) -> None:
        try:
            await self._redis.sadd(self._names.model_registry, *models)
        except RedisError as exc:
            raise ResultStoreError(f"cannot register models: {exc}") from exc

    async def known_models(self) -> set[str]:
        try:
            members = await self._redis.smembers(self._names.model_registry)
            return {m.decode() if isinstance(m, bytes) else m for m in members}
        except RedisError as exc:
            raise ResultStoreError(f"cannot read the model registry: {exc}") from exc

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        await self._redis.aclose()
