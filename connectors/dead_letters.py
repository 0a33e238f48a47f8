"""Dead letters: requests that exhausted their retries, and bytes too broken to answer.

Per model, ``bf:dlq:{model}`` is a stream whose entries hold the full original
request envelope, the error history of every attempt and the attempt count. A
dead-lettered request also gets its terminal ``failed`` result, so no caller
waits forever; ``batchfleet dlq replay`` can later re-run it (see
``ResultStore.reopen_for_replay`` for the generation that makes that safe).

``bf:dlq:_undecodable`` keeps messages that yielded no request ID at all, with
their raw bytes and the reason, so they are never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.errors import ResultStoreError
from schemas.names import Names

#: Garbage should not grow without bound: the oldest undecodable messages go first.
UNDECODABLE_MAXLEN = 100_000


@dataclass(frozen=True, slots=True)
class Undecodable:
    raw: bytes
    reason: str
    source: str


@dataclass(slots=True)
class DeadLetter:
    """One dead-lettered request."""

    request_id: str
    model: str
    envelope: bytes
    attempts: int
    errors: list[dict[str, Any]]
    reason: str
    dead_at: float = field(default_factory=time.time)
    entry_id: str = ""

    @property
    def last_error_type(self) -> str:
        return str(self.errors[-1].get("type", "")) if self.errors else ""


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
        try:
            await pipe.execute()
        except RedisError as exc:
            raise ResultStoreError(f"cannot write the dead-letter stream: {exc}") from exc


class DeadLetterQueue:
    """Per-model dead-letter streams in the result store's Redis."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names

    async def add(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        pipe = self._redis.pipeline(transaction=False)
        for dl in letters:
            pipe.xadd(self._names.dead_letter_stream(dl.model), {
                "id": dl.request_id, "model": dl.model, "envelope": dl.envelope,
                "attempts": dl.attempts, "errors": msgpack.packb(dl.errors),
                "reason": dl.reason, "at": repr(dl.dead_at),
            })
        try:
            await pipe.execute()
        except RedisError as exc:
            raise ResultStoreError(f"cannot write the dead-letter queue: {exc}") from exc

    async def models(self) -> list[str]:
        prefix = self._names.dead_letter_stream("")
        found = [key.decode() async for key in self._redis.scan_iter(
            match=self._names.dead_letter_pattern, _type="stream")]
        return sorted(k[len(prefix):] for k in found if k != self._names.undecodable_stream)

    async def list(self, model: str, count: int = 1000) -> list[DeadLetter]:
        entries: Any = await self._redis.xrange(self._names.dead_letter_stream(model), count=count)
        return [_letter(entry_id, fields) for entry_id, fields in entries or ()]

    async def size(self, model: str) -> int:
        return int(await self._redis.xlen(self._names.dead_letter_stream(model)))

    async def remove(self, letters: Sequence[DeadLetter]) -> int:
        pipe = self._redis.pipeline(transaction=False)
        for dl in letters:
            pipe.xdel(self._names.dead_letter_stream(dl.model), dl.entry_id)
        return sum(await pipe.execute())

    async def purge(self, model: str) -> int:
        stream = self._names.dead_letter_stream(model)
        size = await self._redis.xlen(stream)
        await self._redis.delete(stream)
        return int(size)


def _letter(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    return DeadLetter(
        request_id=fields[b"id"].decode(), model=fields[b"model"].decode(),
        envelope=fields[b"envelope"], attempts=int(fields[b"attempts"]),
        errors=msgpack.unpackb(fields[b"errors"], raw=False),
        reason=fields[b"reason"].decode(), dead_at=float(fields[b"at"]),
        entry_id=entry_id.decode(),
    )
