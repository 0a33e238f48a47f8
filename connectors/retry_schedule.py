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

``add_live`` schedules a retry only while its request is still live at its
generation (record missing or ``pending``, and not at a newer generation), in
the same atomic step: a stale copy (superseded by a DLQ replay) or one whose
request already finished is never retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.values import Retry
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

_CLAIM_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], member)
end
return due
"""


#: KEYS[1]: the schedule, then one result record per retry; ARGV: per retry, in KEYS
#: order, its due time, envelope and generation. 1: scheduled, 0: not live, dropped.
_ADD_LIVE = """
local out = {}
for i = 2, #KEYS do
  local a = (i - 2) * 3 + 1
  local cur = redis.call('HMGET', KEYS[i], 'status', 'gen')
  if (cur[1] and cur[1] ~= 'pending') or tonumber(ARGV[a + 2]) < (tonumber(cur[2]) or 0) then
    out[i - 1] = 0
  else
    redis.call('ZADD', KEYS[1], ARGV[a], ARGV[a + 1])
    out[i - 1] = 1
  end
end
return out
"""


class RetrySchedule:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._key = names.retry_schedule
        self._names = names
        self._claim = client.register_script(_CLAIM_DUE)
        self._add_live = client.register_script(_ADD_LIVE)

    async def add(self, items: Sequence[tuple[float, bytes]]) -> None:
        """Schedule (due epoch seconds, envelope) pairs in one call."""
        if not items:
            return
        with wrap_errors(ResultStoreError, "cannot schedule retries"):
            await self._redis.zadd(self._key, {envelope: due for due, envelope in items})

    async def add_live(self, retries: Sequence[Retry]) -> list[bool]:
        """Schedule each retry whose request is still live at its generation; False where
        it was dropped (finished meanwhile, or superseded by a replay)."""
        if not retries:
            return []
        keys = [self._key, *(self._names.result(r.request_id) for r in retries)]
        args: list[Any] = []
        for r in retries:
            args += [repr(r.due), r.envelope, r.generation]
        with wrap_errors(ResultStoreError, "cannot schedule retries"):
            return [bool(x) for x in await self._add_live(keys=keys, args=args)]

    async def claim_due(self, now: float, limit: int = 500, lease_s: float = 30.0
                        ) -> list[bytes]:
        with wrap_errors(ResultStoreError, "cannot read the retry schedule"):
            return list(await self._claim(keys=[self._key], args=[now, limit, now + lease_s]))

    async def done(self, envelopes: Sequence[bytes]) -> None:
        if envelopes:
            with wrap_errors(ResultStoreError, "cannot clear claimed retries"):
                await self._redis.zrem(self._key, *envelopes)

    @wrap_errors(ResultStoreError, "cannot read the retry schedule")
    async def next_due(self) -> float | None:
        first = await self._redis.zrange(self._key, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    @wrap_errors(ResultStoreError, "cannot read the retry schedule")
    async def size(self) -> int:
        return int(await self._redis.zcard(self._key))
