"""Redis Streams transport: one stream per model and lane, one consumer group.

Retention: a worker acks *and deletes* an entry (``XACK`` + ``XDEL`` in one
round trip) once its result is durable, so a stream only ever holds work not
yet finished and its length is the backlog. Producers add no ``MAXLEN`` by
default, because trimming would drop requests nobody has answered; set
``max_stream_len`` to cap memory when losing the oldest backlog is acceptable.
Crashed consumers' entries are taken over with ``XAUTOCLAIM`` once idle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from connectors.broker import Delivery, LaneBacklog, OutboundMessage
from schemas.errors import TransportError
from schemas.names import LANES, Names

PAYLOAD_FIELD = b"p"


#: XADD a whole chunk in one command: KEYS are the streams, ARGV[1] the MAXLEN (0: none),
#: then per stream, in KEYS order, a count and that many payloads (field 'p', PAYLOAD_FIELD).
_XADD_MANY = """
local maxlen = tonumber(ARGV[1])
local a = 2
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  for j = a + 1, a + n do
    if maxlen > 0 then
      redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'p', ARGV[j])
    else
      redis.call('XADD', key, '*', 'p', ARGV[j])
    end
  end
  a = a + n + 1
end
return a - 2 - #KEYS
"""


class RedisStreamsPublisher:
    """XADDs whole batches in one script call.

    One command however many messages: redis-py packs and parses each pipelined
    command in Python, which cost more client CPU than the rest of a submit.
    """

    def __init__(
        self, client: aioredis.Redis, names: Names, max_stream_len: int | None = None
    ) -> None:
        self._redis = client
        self._names = names
        self._max_len = max_stream_len
        self._xadd_many = client.register_script(_XADD_MANY)

    async def publish(self, messages: Sequence[OutboundMessage]) -> None:
        if not messages:
            return
        by_stream: dict[str, list[bytes]] = {}
        for msg in messages:
            by_stream.setdefault(self._names.stream(msg.model, msg.lane), []).append(msg.payload)
        args: list[Any] = [self._max_len or 0]
        for payloads in by_stream.values():
            args.append(len(payloads))
            args.extend(payloads)
        try:
            await self._xadd_many(keys=list(by_stream), args=args)
        except RedisError as exc:
            raise TransportError(f"XADD to Redis failed: {exc}") from exc

    async def close(self) -> None:
        await self._redis.aclose()


class RedisStreamsConsumer:
    """Reads with XREADGROUP, acks with XACK+XDEL, reclaims orphans with XAUTOCLAIM."""

    def __init__(
        self,
        client: aioredis.Redis,
        names: Names,
        consumer_name: str,
        *,
        claim_idle_ms: int = 60_000,
        claim_interval_s: float | None = None,
        group: str | None = None,
    ) -> None:
        self._redis = client
        self._names = names
        self._consumer = consumer_name
        self._group = group or names.consumer_group
        self._claim_idle_ms = claim_idle_ms
        # Look for orphans twice per idle period, but at most every 5 s.
        self._claim_interval_s = claim_interval_s or min(5.0, claim_idle_ms / 2000.0)
        self._next_claim = 0.0
        self._streams: dict[bytes, tuple[str, str]] = {}

    async def start(self, models: Sequence[str]) -> None:
        """Create the consumer group on every lane (idempotent: BUSYGROUP is fine)."""
        for model in models:
            for lane in LANES:
                stream = self._names.stream(model, lane)
                self._streams[stream.encode()] = (model, lane)
                try:
                    await self._redis.xgroup_create(stream, self._group, id="0", mkstream=True)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise TransportError(f"cannot create group on {stream}: {exc}") from exc
                except RedisError as exc:
                    raise TransportError(f"Redis unreachable: {exc}") from exc

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Orphans first (when a reclaim is due), then new entries, interactive lanes first."""
        try:
            out = await self._reclaim(max_count) if time.monotonic() >= self._next_claim else []
            if len(out) < max_count:
                block_ms = 0 if out else max(1, int(timeout_s * 1000))
                reply = await self._redis.xreadgroup(
                    self._group,
                    self._consumer,
                    {stream: ">" for stream in self._streams},
                    count=max_count - len(out),
                    block=None if block_ms == 0 else block_ms,
                )
                out.extend(self._deliveries(reply))
        except RedisError as exc:
            raise TransportError(f"XREADGROUP failed: {exc}") from exc
        return out

    def _deliveries(self, reply: Any) -> list[Delivery]:
        out: list[Delivery] = []
        for stream, entries in reply or ():
            model, lane = self._streams[stream]
            for entry_id, fields in entries:
                payload = fields.get(PAYLOAD_FIELD, b"") if fields else b""
                out.append(Delivery(model, lane, payload, (stream, entry_id), delivery_count=1))
        out.sort(key=lambda d: LANES.index(d.lane))
        return out

    async def _reclaim(self, max_count: int) -> list[Delivery]:
        """Take over entries other consumers left idle too long (they crashed or hung)."""
        self._next_claim = time.monotonic() + self._claim_interval_s
        out: list[Delivery] = []
        for stream, (model, lane) in self._streams.items():
            cursor: Any = "0-0"
            while len(out) < max_count:
                cursor, entries, deleted = await self._redis.xautoclaim(
                    stream, self._group, self._consumer, self._claim_idle_ms,
                    start_id=cursor, count=max_count - len(out),
                )
                if deleted:  # entries deleted while pending: nothing to do but ack them
                    await self._redis.xack(stream, self._group, *deleted)
                for entry_id, fields in entries:
                    if fields is None:
                        continue
                    out.append(Delivery(model, lane, fields.get(PAYLOAD_FIELD, b""),
                                        (stream, entry_id), delivery_count=2))
                if cursor in (b"0-0", "0-0"):
                    break
        return out

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """XACK and XDEL every delivery of a batch in one round trip."""
        if not deliveries:
            return
        by_stream: dict[bytes, list[Any]] = {}
        for d in deliveries:
            stream, entry_id = d.token
            by_stream.setdefault(stream, []).append(entry_id)
        pipe = self._redis.pipeline(transaction=True)  # never acked-but-not-deleted
        for stream, ids in by_stream.items():
            pipe.xack(stream, self._group, *ids)
            pipe.xdel(stream, *ids)
        try:
            await pipe.execute()
        except RedisError as exc:
            raise TransportError(f"XACK failed: {exc}") from exc

    async def pause(self) -> None:
        """Nothing to do: a paused worker simply stops calling XREADGROUP."""

    async def resume(self) -> None:
        """Nothing to do: see :meth:`pause`."""

    async def backlog(self) -> list[LaneBacklog]:
        """Depth and oldest age per lane. Finished entries are deleted, so the first entry
        left is the oldest unfinished request and its ID carries its arrival time."""
        pipe = self._redis.pipeline(transaction=False)
        for stream in self._streams:
            pipe.xlen(stream)
            pipe.xrange(stream, count=1)
        try:
            replies = await pipe.execute()
        except RedisError as exc:
            raise TransportError(f"XLEN failed: {exc}") from exc
        now_ms = time.time() * 1000.0
        out = []
        for i, (model, lane) in enumerate(self._streams.values()):
            depth, first = replies[2 * i], replies[2 * i + 1]
            age = None
            if first:
                entry_ms = int(first[0][0].split(b"-")[0])
                age = max(0.0, (now_ms - entry_ms) / 1000.0)
            out.append(LaneBacklog(model, lane, int(depth), age if depth else 0.0))
        return out

    async def close(self) -> None:
        await self._redis.aclose()
