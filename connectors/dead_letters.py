"""Dead letters: requests that exhausted their retries, and bytes too broken to answer.

Per model, ``bf:dlq:{model}`` is a stream whose entries hold the full original
request envelope, the error history of every attempt and the attempt count. A
dead-lettered request also gets its terminal ``failed`` result, so no caller
waits forever; ``batchfleet dlq replay`` can later re-run it (see
``ResultStore.reopen_for_replay`` for the generation that makes that safe).

One entry per request ID and generation: :meth:`DeadLetterQueue.add` is one
Lua call that appends a letter only if the result record has not yet been
dead-lettered at that generation (field ``dlq``), is not terminal, and is not
at a newer generation (a stale copy, superseded by a replay). So a crashed
completion that runs again, or two copies of one request that both exhaust
their retries, leave a single entry. Readers page through a stream with
``XRANGE`` and a cursor; the models with dead letters are kept in a set
(``bf:dlq:_models``), so nothing scans the keyspace.

``bf:dlq:_undecodable`` keeps messages that yielded no request ID at all, with
their raw bytes and the reason, so they are never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgpack
import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.values import DeadLetter, Lettered, Undecodable
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

#: Garbage should not grow without bound: the oldest undecodable messages go first.
UNDECODABLE_MAXLEN = 100_000
#: XRANGE page size for readers: bounded replies however long a DLQ grows.
PAGE = 500
#: Fields per letter in ``_ADD`` (after the generation that leads them).
_FIELDS = ("id", "model", "envelope", "attempts", "errors", "reason", "at")

#: KEYS: the model set, then per letter its result record and DLQ stream. ARGV[1]: the
#: record TTL if the letter creates it; then per letter the generation and _FIELDS.
_ADD = """
local ttl = tonumber(ARGV[1])
local out = {}
local a = 2
for i = 2, #KEYS, 2 do
  local record, stream = KEYS[i], KEYS[i + 1]
  local gen = tonumber(ARGV[a])
  local cur = redis.call('HMGET', record, 'status', 'gen', 'dlq')
  local cur_gen = tonumber(cur[2]) or 0
  if gen < cur_gen then
    out[#out + 1] = -1
  elseif (tonumber(cur[3]) or -1) >= gen or (cur[1] and cur[1] ~= 'pending') then
    out[#out + 1] = 0
  else
    redis.call('XADD', stream, '*', 'id', ARGV[a + 1], 'model', ARGV[a + 2],
      'envelope', ARGV[a + 3], 'attempts', ARGV[a + 4], 'errors', ARGV[a + 5],
      'reason', ARGV[a + 6], 'at', ARGV[a + 7], 'gen', ARGV[a])
    redis.call('SADD', KEYS[1], ARGV[a + 2])
    redis.call('HSET', record, 'dlq', ARGV[a])
    if redis.call('TTL', record) < 0 then redis.call('EXPIRE', record, ttl) end
    out[#out + 1] = 1
  end
  a = a + 8
end
return out
"""


class UndecodableSink:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._stream = names.undecodable_stream

    async def add(self, items: Sequence[Undecodable]) -> None:
        if not items:
            return
        pipe = self._redis.pipeline(transaction=False)
        now = repr(time.time())
        for item in items:
            pipe.xadd(
                self._stream,
                {"raw": item.raw, "reason": item.reason, "source": item.source, "at": now},
                maxlen=UNDECODABLE_MAXLEN, approximate=True,
            )
        with wrap_errors(ResultStoreError, "cannot write the dead-letter stream"):
            await pipe.execute()

    @wrap_errors(ResultStoreError, "cannot read the dead-letter stream")
    async def size(self) -> int:
        return int(await self._redis.xlen(self._stream))


class DeadLetterQueue:
    """Per-model dead-letter streams in the result store's Redis."""

    def __init__(self, client: aioredis.Redis, names: Names, record_ttl_s: int = 24 * 3600
                 ) -> None:
        self._redis = client
        self._names = names
        self._models_key = names.dead_letter_stream("_models")
        self._ttl_s = record_ttl_s
        self._add = client.register_script(_ADD)

    async def add(self, letters: Sequence[DeadLetter]) -> list[Lettered]:
        """Append each letter unless its (request ID, generation) already has one, its
        record is terminal, or a replay superseded it; one atomic call for the batch."""
        if not letters:
            return []
        keys = [self._models_key]
        args: list[Any] = [self._ttl_s]
        for dl in letters:
            keys += [self._names.result(dl.request_id), self._names.dead_letter_stream(dl.model)]
            args += [dl.generation, dl.request_id, dl.model, dl.envelope, dl.attempts,
                     msgpack.packb(dl.errors), dl.reason, repr(dl.dead_at)]
        with wrap_errors(ResultStoreError, "cannot write the dead-letter queue"):
            return [Lettered(int(x)) for x in await self._add(keys=keys, args=args)]

    async def models(self) -> list[str]:
        """Models with dead letters: those ever dead-lettered (a set kept by :meth:`add`)
        plus the registered ones, for letters written before the set existed."""
        with wrap_errors(ResultStoreError, "cannot list dead-letter queues"):
            found = {_text(m) for m in await self._redis.smembers(self._models_key)}
            found |= await RedisModelRegistry(self._redis, self._names).names()
            ordered = sorted(found)
            pipe = self._redis.pipeline(transaction=False)
            for model in ordered:
                pipe.xlen(self._names.dead_letter_stream(model))
            sizes = await pipe.execute()
        return [m for m, size in zip(ordered, sizes, strict=True) if size]

    async def pages(self, model: str, page: int = PAGE, after: str = ""
                    ) -> AsyncIterator[list[DeadLetter]]:
        """Every letter of a model (past the entry ID ``after``), oldest first, ``page`` at
        a time (XRANGE from a cursor): bounded replies at any size, and entries removed
        meanwhile are fine."""
        stream = self._names.dead_letter_stream(model)
        start = f"({after}" if after else "-"
        while True:
            with wrap_errors(ResultStoreError, "cannot read the dead-letter queue"):
                entries: Any = await self._redis.xrange(stream, min=start, count=page)
            if not entries:
                return
            yield [_letter(entry_id, fields) for entry_id, fields in entries]
            if len(entries) < page:
                return
            start = "(" + _text(entries[-1][0])

    async def newest(self, model: str, count: int, before: str = "") -> list[DeadLetter]:
        """Up to ``count`` letters, newest first, older than the entry ID ``before`` (one
        XREVRANGE: a page of the console's list, bounded at any queue length)."""
        stream = self._names.dead_letter_stream(model)
        with wrap_errors(ResultStoreError, "cannot read the dead-letter queue"):
            entries: Any = await self._redis.xrevrange(
                stream, max=f"({before}" if before else "+", count=count)
        return [_letter(entry_id, fields) for entry_id, fields in entries]

    async def list(self, model: str) -> list[DeadLetter]:
        """All of a model's letters (paged underneath)."""
        return [dl async for batch in self.pages(model) for dl in batch]

    @wrap_errors(ResultStoreError, "cannot read the dead-letter queue")
    async def size(self, model: str) -> int:
        return int(await self._redis.xlen(self._names.dead_letter_stream(model)))

    @wrap_errors(ResultStoreError, "cannot read the dead-letter queues")
    async def sizes(self, models: Sequence[str]) -> dict[str, int]:
        """Letters per model in one round trip (the fleet reader's DLQ column)."""
        if not models:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for model in models:
            pipe.xlen(self._names.dead_letter_stream(model))
        return {m: int(n) for m, n in zip(models, await pipe.execute(), strict=True)}

    async def remove(self, letters: Sequence[DeadLetter]) -> int:
        if not letters:
            return 0
        pipe = self._redis.pipeline(transaction=False)
        for dl in letters:
            pipe.xdel(self._names.dead_letter_stream(dl.model), dl.entry_id)
        with wrap_errors(ResultStoreError, "cannot remove dead letters"):
            return sum(await pipe.execute())

    async def purge(self, model: str) -> int:
        """Drop a model's whole DLQ; counted and dropped atomically, so a letter added
        meanwhile is either counted and gone or kept."""
        stream = self._names.dead_letter_stream(model)
        with wrap_errors(ResultStoreError, "cannot purge the dead-letter queue"):
            # one script, not a MULTI: a cluster pipeline queues UNLINK as a coroutine of
            # its own, so its transaction ran XLEN alone and the purge failed on a cluster
            size = await self._redis.eval(PURGE_SCRIPT, 1, stream)
        return int(size)



#: Count and drop one DLQ stream atomically (a single key, so it runs on a cluster too).
PURGE_SCRIPT = """
local size = redis.call('XLEN', KEYS[1])
redis.call('UNLINK', KEYS[1])
return size
"""

def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _letter(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    return DeadLetter(
        request_id=fields[b"id"].decode(), model=fields[b"model"].decode(),
        envelope=fields[b"envelope"], attempts=int(fields[b"attempts"]),
        errors=msgpack.unpackb(fields[b"errors"], raw=False),
        reason=fields[b"reason"].decode(), dead_at=float(fields[b"at"]),
        entry_id=entry_id.decode(), generation=int(fields.get(b"gen", b"0")),
    )
