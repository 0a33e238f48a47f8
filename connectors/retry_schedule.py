"""Delayed redelivery: a due-time schedule in Redis that any worker re-enqueues from.

Why a schedule and not retry topics: it works the same for both transports
(Kafka retry topics would need one topic per delay tier and have no Redis
Streams twin), a delay is exact rather than rounded to a tier, and waiting
requests cost nothing on the consumer: the worker's fetch loop never blocks on
them. Each member is a request envelope already stamped with its next attempt.

Claiming is atomic and leased: ``claim_due`` pushes due members' scores
``lease_s`` into the future and returns them; the claimer publishes them and
then removes them. A worker that dies in between leaves them to come due again
after the lease (a duplicate at worst, which the result store absorbs).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from schemas.errors import ResultStoreError
from schemas.names import Names

_CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], member)
end
return due
"""


class RetrySchedule:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._key = names.retry_schedule
        self._claim = client.register_script(_CLAIM_DUE)

    async def add(self, items: Sequence[tuple[float, bytes]]) -> None:
        """Schedule (due epoch seconds, envelope) pairs in one call."""
        if not items:
            return
        try:
            await self._redis.zadd(self._key, {envelope: due for due, envelope in items})
        except RedisError as exc:
            raise ResultStoreError(f"cannot schedule retries: {exc}") from exc

    async def claim_due(self, now: float, limit: int = 500, lease_s: float = 30.0
                        ) -> list[bytes]:
        try:
            return list(await self._claim(keys=[self._key], args=[now, limit, now + lease_s]))
        except RedisError as exc:
            raise ResultStoreError(f"cannot read the retry schedule: {exc}") from exc

    async def done(self, envelopes: Sequence[bytes]) -> None:
        if envelopes:
            try:
                await self._redis.zrem(self._key, *envelopes)
            except RedisError as exc:
                raise ResultStoreError(f"cannot clear claimed retries: {exc}") from exc

    async def next_due(self) -> float | None:
        first = await self._redis.zrange(self._key, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def size(self) -> int:
        return int(await self._redis.zcard(self._key))
