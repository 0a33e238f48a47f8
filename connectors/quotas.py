"""Per-key quotas shared by every gateway replica: a token bucket and an in-flight set.

Both live in Redis and are checked and charged by one Lua script, so one
admission is one round trip however many replicas share the key, and two
replicas can never both spend the last token. The clock is Redis's (``TIME``),
so replicas with skewed clocks still agree.

The in-flight set holds ``request ID -> expiry``. A terminal write removes the ID
(``_WRITE_TERMINAL`` in connectors/result_store.py, through the record's
``owner``), whatever the status: ``expired`` included. The expiry is the result
TTL, the life of the request's pending record, and never its deadline: a request
whose deadline has passed is still not terminal until a worker answers it
``expired``, so freeing its slot at the deadline let a key hold more non-terminal
requests than its limit (26 against ``in_flight=10`` with ``deadline_s: 0.01``).
Admission drops expired members first, so a request whose record is gone (it can
never finish) stops counting when its record does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

#: KEYS: bucket hash {tokens, ts}, in-flight sorted set. ARGV: rate, burst, max in flight,
#: count, then (request ID, lifetime s) pairs. Returns {code, tokens, in flight, retry
#: after s}: code 1 admitted, 0 over the rate, -1 over the in-flight limit, -2 more than
#: the burst or the in-flight limit at once (never admissible). Floats travel as strings.
_ADMIT = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local max_inflight, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tokens = burst
if rate > 0 then
  local cur = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  if cur[1] then
    tokens = math.min(burst, tonumber(cur[1]) + math.max(0, now - tonumber(cur[2])) * rate)
  end
end
local inflight = 0
if max_inflight > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[2])
end
local function reply(code, retry)
  return {code, tostring(tokens), inflight, tostring(retry)}
end
if (rate > 0 and n > burst) or (max_inflight > 0 and n > max_inflight) then
  return reply(-2, 0)
end
if max_inflight > 0 and inflight + n > max_inflight then return reply(-1, 1) end
if rate > 0 and tokens < n then return reply(0, (n - tokens) / rate) end
if rate > 0 then
  tokens = tokens - n
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
end
if max_inflight > 0 then
  local longest = 0
  for i = 5, #ARGV, 2 do
    local life = tonumber(ARGV[i + 1])
    redis.call('ZADD', KEYS[2], now + life, ARGV[i])
    longest = math.max(longest, life)
  end
  inflight = redis.call('ZCARD', KEYS[2])
  if redis.call('TTL', KEYS[2]) < longest then
    redis.call('EXPIRE', KEYS[2], math.ceil(longest) + 1)
  end
end
return reply(1, 0)
"""

ADMITTED, OVER_RATE, OVER_IN_FLIGHT, TOO_BIG = 1, 0, -1, -2
_HOLD_MARGIN_S = 60.0


@dataclass(frozen=True, slots=True)
class Quota:
    """One API key's limits; 0 means unlimited."""

    rate_per_s: float = 0.0
    #: Requests that may be sent at once after a quiet spell (bucket size).
    burst: int = 0
    max_in_flight: int = 0

    @property
    def limited(self) -> bool:
        return self.rate_per_s > 0 or self.max_in_flight > 0

    @property
    def bucket(self) -> int:
        """The burst, defaulting to one second's worth of requests."""
        return self.burst or max(1, math.ceil(self.rate_per_s))


@dataclass(frozen=True, slots=True)
class Admission:
    code: int
    tokens: float
    in_flight: int
    retry_after_s: float

    @property
    def allowed(self) -> bool:
        return self.code == ADMITTED

    def headers(self, quota: Quota) -> dict[str, str]:
        """IETF draft RateLimit-* headers: the bucket when a rate is set, else in-flight."""
        if quota.rate_per_s > 0:
            limit, remaining = quota.bucket, max(0, math.floor(self.tokens))
            reset = math.ceil(max(self.retry_after_s,
                                  (quota.bucket - self.tokens) / quota.rate_per_s))
        else:
            limit, remaining = quota.max_in_flight, max(0, quota.max_in_flight - self.in_flight)
            reset = math.ceil(self.retry_after_s)
        return {"RateLimit-Limit": str(limit), "RateLimit-Remaining": str(remaining),
                "RateLimit-Reset": str(reset)}


class QuotaGate:
    """Admits (and charges) a key's submissions against its quota."""

    def __init__(self, client: aioredis.Redis, names: Names,
                 hold_s: float = DEFAULT_TTL_S) -> None:
        self._names = names
        #: How long a slot lives unless a terminal write frees it: the records' TTL, and a
        #: margin, as the record is written (and its TTL starts) after the admission.
        self._hold_s = max(1.0, hold_s) + _HOLD_MARGIN_S
        self._inflight = names.inflight_prefix
        self._admit = client.register_script(_ADMIT)
        self._redis = client

    @classmethod
    def over(cls, store: ResultStore) -> QuotaGate:
        """A gate over the result store's own connections (quotas live beside the records:
        a won terminal write frees the in-flight slot, and a slot lives as long as a record)."""
        return cls(store.redis, store.names, store.ttl_s)

    async def admit(self, owner: str, quota: Quota, request_ids: Sequence[str]) -> Admission:
        """Charge ``len(request_ids)`` tokens and in-flight slots, or refuse them all. A
        slot is held until the request's terminal write, or its record's TTL."""
        args: list[str | int | float] = [quota.rate_per_s, quota.bucket, quota.max_in_flight,
                                         len(request_ids)]
        if quota.max_in_flight > 0:
            for rid in request_ids:
                args += [rid, self._hold_s]
        with wrap_errors(ResultStoreError, "cannot check the quota"):
            code, tokens, in_flight, retry = await self._admit(
                keys=[self._names.quota_bucket(owner), self._inflight + owner], args=args)
        return Admission(int(code), float(tokens), int(in_flight), float(retry))

    async def release(self, owner: str, request_ids: Sequence[str]) -> None:
        """Give back the in-flight slots of requests that were admitted but never enqueued."""
        if not request_ids:
            return
        with wrap_errors(ResultStoreError, "cannot release in-flight slots"):
            await self._redis.zrem(self._inflight + owner, *request_ids)
