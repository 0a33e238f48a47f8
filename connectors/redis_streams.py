"""Redis Streams transport: one stream per model and lane, one consumer group.

Retention: a worker acks *and deletes* an entry (``XACK`` + ``XDEL`` in one
round trip) once its result is durable, so a stream only ever holds work not
yet finished and its length is the backlog. Producers add no ``MAXLEN`` by
default, because trimming would drop requests nobody has answered; set
``max_stream_len`` to cap memory when losing the oldest backlog is acceptable.
Crashed consumers' entries are taken over with ``XAUTOCLAIM`` once idle.

Self-healing: when Redis loses its data (restarted without persistence, flushed,
or a stream key evicted) the consumer group is gone and ``XREADGROUP`` answers
``NOGROUP``. The consumer then recreates the group (and the stream) in place and
notes the moment in :attr:`RedisStreamsConsumer.lane_losses`, which the worker
writes to the result store (``Names.lane_loss``) so that waiters of the requests
lost with it stop waiting (``RequestLostError``).

Sharded lanes (``--lane-shards MODEL=K``): a lane is K streams, ``Names.stream(model,
lane, s)`` for ``s`` in ``0..K-1`` (shard 0 is the unsharded name). The publisher puts a
request on shard ``shard_for(request_id, K)``; the consumer reads every shard stream of
its lanes in the same ``XREADGROUP`` with an equal ``COUNT`` each (so no shard's backlog
waits on another's, and interactive still comes before bulk), and it reads every shard
that may still hold work: its own K and the registry's high-water mark
(``lane_shards_max``, re-read every few seconds through :meth:`use_shards`), so a
lowered K strands nothing. Recovery, ``XAUTOCLAIM`` and the backlog cover every shard;
the backlog of a lane is the sum over its shards.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError, ResponseError

from batchfleet.connectors.broker import Delivery, LaneBacklog, OutboundMessage, ShardSource
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import is_cluster, queue_script
from batchfleet.connectors.redis_pressure import RedisPressure, read_pressure
from batchfleet.schemas.envelopes import peek_header
from batchfleet.schemas.errors import BatchfleetError, TransportError
from batchfleet.schemas.names import LANES, Names, lane_loss_field, shard_for

PAYLOAD_FIELD = b"p"
#: A lane recreated with entries already in it (producers added them after the loss):
#: the loss moment is the earliest ``enqueued_at`` among its first entries that were
#: added within this long of being enqueued (a retry republished later keeps its old
#: ``enqueued_at`` and must not count); failing that, this long before the first entry.
LOSS_MARGIN_MS = 1000
#: How many of a recreated lane's first entries are looked at for that.
_LOSS_PEEK = 100
#: How often a consumer re-reads how many shard streams its lanes may hold work on.
SHARD_REFRESH_S = 5.0

log = structlog.get_logger("batchfleet.redis_streams")


def _clock(reply: Any) -> tuple[int, int]:
    """``TIME``'s (seconds, microseconds); a cluster client may answer per node."""
    if isinstance(reply, dict):
        reply = next(iter(reply.values()))
    secs, micros = reply
    return int(secs), int(micros)


def group_lost(exc: ResponseError) -> bool:
    """The group or its stream is gone: Redis lost its data, or the key was deleted."""
    text = str(exc)
    return text.startswith("NOGROUP") or text.startswith("UNBLOCKED")


#: XADD a whole chunk in one command: KEYS are the streams, ARGV[1] the MAXLEN (0: none),
#: then per stream, in KEYS order, a count and that many payloads (field 'p', PAYLOAD_FIELD).
#: Shared: the cluster publisher (``connectors/cluster_streams.py``) runs it per slot group.
XADD_MANY_SCRIPT = """
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


#: XACK and XDEL of ARGV[first..last] on one stream, atomically inside its script (never
#: acked but not deleted, which would leave a finished entry counted as backlog). Lua's
#: ``unpack`` refuses more than a few thousand values, so the IDs go 1,000 at a time.
#: Shared: ``ACK_DEL_SCRIPT`` and the write-and-ack script (``connectors.redis_finish``).
ACK_DEL_FN = """
local function ack_del(stream, group, first, last)
  for i = first, last, 1000 do
    local j = math.min(i + 999, last)
    redis.call('XACK', stream, group, unpack(ARGV, i, j))
    redis.call('XDEL', stream, unpack(ARGV, i, j))
  end
end
"""

#: One stream's ack in one command: KEYS[1] the stream, ARGV[1] the group, then the entry
#: IDs. Shared with the cluster consumer.
ACK_DEL_SCRIPT = ACK_DEL_FN + """
ack_del(KEYS[1], ARGV[1], 2, #ARGV)
return #ARGV - 1
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
        self._xadd_many = client.register_script(XADD_MANY_SCRIPT)

    def _by_stream(self, messages: Sequence[OutboundMessage]) -> dict[str, list[bytes]]:
        """Payloads grouped by the stream (lane shard) each message goes to, in order."""
        by_stream: dict[str, list[bytes]] = {}
        for msg in messages:
            stream = self._names.stream(msg.model, msg.lane, shard_for(msg.key, msg.shards))
            by_stream.setdefault(stream, []).append(msg.payload)
        return by_stream

    async def publish(self, messages: Sequence[OutboundMessage]) -> None:
        if not messages:
            return
        by_stream = self._by_stream(messages)
        args: list[Any] = [self._max_len or 0]
        for payloads in by_stream.values():
            args.append(len(payloads))
            args.extend(payloads)
        with wrap_errors(TransportError, "XADD to Redis failed"):
            await self._xadd_many(keys=list(by_stream), args=args)

    async def pressure(self, lanes: Sequence[tuple[str, str]],
                       shards: Mapping[str, int] | None = None) -> RedisPressure:
        """Memory and the depth of these (model, lane)s summed over their shards, in one
        round trip (admission)."""
        return await read_pressure(self._redis, self._names, lanes, shards)

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
        self._ack_del = client.register_script(ACK_DEL_SCRIPT)
        #: ``{model}:{lane}`` -> epoch ms of lanes recreated after a loss, not yet recorded
        #: in the store (the worker's heartbeat drains this; see ``Names.lane_loss``).
        self.lane_losses: dict[str, int] = {}
        #: Models whose lanes are paused (their breaker is open): left out of every read.
        self._paused: set[str] = set()
        #: Each stream's shard index (0 for an unsharded lane).
        self._shard: dict[bytes, int] = {}
        #: The lanes' models as started (version lanes ``m@v`` included).
        self._models: list[str] = []
        #: Base model -> shard streams read per lane; this worker's own K, then the
        #: registry's high-water mark (``use_shards``). Never lowered while running.
        self._shards: dict[str, int] = {}
        self._own_shards: dict[str, int] = {}
        self._shard_source: ShardSource | None = None
        self._next_shards = float("inf")
        self._claim_turn = 0

    async def start(self, models: Sequence[str]) -> None:
        """Create the consumer group on every lane (idempotent: BUSYGROUP is fine)."""
        self._models = list(dict.fromkeys([*self._models, *models]))
        for model in models:
            for lane in LANES:
                await self._add_stream(model, lane, 0)

    async def _add_stream(self, model: str, lane: str, shard: int) -> None:
        stream = self._names.stream(model, lane, shard)
        if stream.encode() in self._streams:
            return
        try:
            await self._redis.xgroup_create(stream, self._group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise TransportError(f"cannot create group on {stream}: {exc}") from exc
        except RedisError as exc:
            raise TransportError(f"Redis unreachable: {exc}") from exc
        self._streams[stream.encode()] = (model, lane)
        self._shard[stream.encode()] = shard

    async def use_shards(self, own: Mapping[str, int], source: ShardSource | None = None
                         ) -> None:
        """Read every shard stream of the started lanes: ``own`` (base model -> this
        worker's K) and, re-read every :data:`SHARD_REFRESH_S`, what ``source`` says may
        still hold work (a version lane ``m@v`` is sharded like ``m``)."""
        self._own_shards = {m: max(1, k) for m, k in own.items()}
        self._shard_source = source
        await self._refresh_shards()

    async def _refresh_shards(self) -> None:
        self._next_shards = (time.monotonic() + SHARD_REFRESH_S if self._shard_source
                             else float("inf"))
        bases = sorted({m.partition("@")[0] for m in self._models})
        wanted = {b: max(self._own_shards.get(b, 1), self._shards.get(b, 1)) for b in bases}
        if self._shard_source is not None:
            try:
                for base, k in (await self._shard_source.consumed_shards(bases)).items():
                    wanted[base] = max(wanted.get(base, 1), k)
            except BatchfleetError as exc:  # the registry is unreadable: keep what we read
                log.warning("cannot read lane shard counts; reading the shards known so far",
                            error=str(exc))
        for model in self._models:
            for shard in range(1, wanted.get(model.partition("@")[0], 1)):
                for lane in LANES:
                    await self._add_stream(model, lane, shard)
        self._shards = wanted

    @property
    def lane_shards(self) -> dict[str, int]:
        """Base model -> how many shard streams of each lane this consumer reads."""
        return dict(self._shards)

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Orphans first (when a reclaim is due), then new entries, interactive lanes first.

        A lost group (NOGROUP, or a blocked read UNBLOCKED by the key's deletion) is
        recreated here, so the worker keeps serving on the same process."""
        out: list[Delivery] = []
        try:
            if time.monotonic() >= self._next_shards:
                await self._refresh_shards()
            if time.monotonic() >= self._next_claim:
                out = await self._reclaim(max_count)
            streams: dict[Any, Any] = self._live({stream: ">" for stream in self._streams})
            if len(out) < max_count and streams:  # none when every lane is paused
                block_ms = 0 if out else max(1, int(timeout_s * 1000))
                # COUNT is per stream: split the room evenly over a lane's shards, so every
                # shard gets the same share of each read and the total stays bounded
                widest = max(self._shards.values(), default=1)
                out.extend(self._deliveries(await self._read(
                    streams, max(1, -(-(max_count - len(out)) // widest)),
                    None if block_ms == 0 else block_ms)))
        except ResponseError as exc:
            if not group_lost(exc):
                raise TransportError(f"XREADGROUP failed: {exc}") from exc
            await self.recover()
        except RedisError as exc:
            raise TransportError(f"XREADGROUP failed: {exc}") from exc
        return out

    async def _read(self, streams: dict[Any, Any], count: int, block_ms: int | None) -> Any:
        """One ``XREADGROUP`` over every stream (a cluster splits it per slot)."""
        return await self._redis.xreadgroup(self._group, self._consumer, streams,
                                            count=count, block=block_ms)

    async def recover(self) -> list[str]:
        """Recreate every lost group (and stream) in place; returns the lanes recreated.

        Each lane is one transaction: create the group at ``0`` (entries producers added
        since the loss are served), read its first entries and the server's clock. Entries
        enqueued before the loss are gone; that moment (see :func:`loss_moment`) is noted
        in :attr:`lane_losses`.
        One warning per recovery, not one per failed read."""
        recreated: list[str] = []
        cluster = is_cluster(self._redis)
        for stream, (model, lane) in self._streams.items():
            # One transaction per lane. On a cluster, TIME has no slot and a cluster
            # pipeline refuses it, so there the clock is a call of its own.
            pipe = self._redis.pipeline(transaction=not cluster)
            pipe.xgroup_create(stream, self._group, id="0", mkstream=True)
            pipe.xrange(stream, count=_LOSS_PEEK)
            if not cluster:
                pipe.time()
            try:
                replies = await pipe.execute(raise_on_error=False)
                created, first = replies[0], replies[1]
                secs, micros = replies[2] if not cluster else _clock(await self._redis.time())
            except RedisError as exc:
                raise TransportError(f"cannot recreate group on {stream!r}: {exc}") from exc
            if isinstance(created, ResponseError):
                if "BUSYGROUP" in str(created):
                    continue
                raise TransportError(f"cannot recreate group on {stream!r}: {created}")
            now_ms = int(secs) * 1000 + int(micros) // 1000
            lost_before = min(now_ms, loss_moment(first)) if first else now_ms
            key = lane_loss_field(model, lane)
            self.lane_losses[key] = max(lost_before, self.lane_losses.get(key, 0))
            recreated.append(key)
        if recreated:
            log.warning("consumer group lost (Redis restarted empty, flushed, or the stream "
                        "evicted); recreated it: requests queued there before now are lost "
                        "and their waiters told so", lanes=recreated, group=self._group)
        return recreated

    def _deliveries(self, reply: Any) -> list[Delivery]:
        out: list[Delivery] = []
        for stream, entries in reply or ():
            model, lane = self._streams[stream]
            for entry_id, fields in entries:
                payload = fields.get(PAYLOAD_FIELD, b"") if fields else b""
                out.append(Delivery(model, lane, payload, (stream, entry_id), delivery_count=1))
        if reply and len(reply) > 1:  # one stream's entries share a lane: nothing to order
            out.sort(key=lambda d: LANES.index(d.lane))
        return out

    async def _reclaim(self, max_count: int) -> list[Delivery]:
        """Take over entries other consumers left idle too long (they crashed or hung)."""
        self._next_claim = time.monotonic() + self._claim_interval_s
        out: list[Delivery] = []
        # interactive lanes first; within a lane, each round starts at the next shard, so
        # one shard's orphans never keep the others' waiting
        turn, self._claim_turn = self._claim_turn, self._claim_turn + 1
        widest = max(self._shards.values(), default=1)
        order = sorted(self._live(self._streams).items(), key=lambda item: (
            LANES.index(item[1][1]), (self._shard.get(item[0], 0) - turn) % widest))
        for stream, (model, lane) in order:
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

    async def keep_alive(self, deliveries: Sequence[Delivery]) -> None:
        """Reset the idle time of held entries: ``XCLAIM`` to ourselves with min-idle 0
        and JUSTID (no delivery count bump), per stream, in one round trip. An entry
        acked meanwhile is simply not claimed."""
        if not deliveries:
            return
        by_stream = entries_by_stream(deliveries)
        pipe = self._redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xclaim(stream, self._group, self._consumer, 0, ids, justid=True)
        with wrap_errors(TransportError, "XCLAIM (lease refresh) failed"):
            await pipe.execute()

    @property
    def group(self) -> str:
        """The consumer group, for an ack sent inside another script
        (``connectors.redis_finish``)."""
        return self._group

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """XACK and XDEL every delivery of a batch in one round trip: one script call per
        stream (one command instead of MULTI, XACK, XDEL and EXEC)."""
        if not deliveries:
            return
        by_stream = entries_by_stream(deliveries)
        with wrap_errors(TransportError, "XACK failed"):
            if len(by_stream) == 1:
                [(stream, ids)] = by_stream.items()
                await self._ack_del(keys=[stream], args=[self._group, *ids])
                return
            pipe = self._redis.pipeline(transaction=False)
            for stream, ids in by_stream.items():
                await queue_script(pipe, self._ack_del, [stream], [self._group, *ids])
            await pipe.execute()

    async def pause(self, models: Sequence[str] | None = None) -> None:
        """Leave these models' streams (all when None) out of XREADGROUP and XAUTOCLAIM."""
        self._paused.update(models if models is not None else
                            {m for m, _ in self._streams.values()})

    async def resume(self, models: Sequence[str] | None = None) -> None:
        """Read these models' streams (all when None) again."""
        if models is None:
            self._paused.clear()
        else:
            self._paused.difference_update(models)

    def _live(self, streams: dict[bytes, Any]) -> dict[bytes, Any]:
        if not self._paused:
            return streams
        # a version lane ("m@v2") pauses with its model
        return {k: v for k, v in streams.items()
                if self._streams[k][0].partition("@")[0] not in self._paused}

    async def backlog(self) -> list[LaneBacklog]:
        """Depth and oldest age per lane, summed over its shard streams (the oldest age is
        the oldest shard's). Finished entries are deleted, so the first entry left is the
        oldest unfinished request and its ID carries its arrival time."""
        pipe = self._redis.pipeline(transaction=False)
        for stream in self._streams:
            pipe.xlen(stream)
            pipe.xrange(stream, count=1)
        with wrap_errors(TransportError, "XLEN failed"):
            replies = await pipe.execute()
        now_ms = time.time() * 1000.0
        depths: dict[tuple[str, str], int] = {}
        ages: dict[tuple[str, str], list[float]] = {}
        for i, key in enumerate(self._streams.values()):
            depth, first = int(replies[2 * i]), replies[2 * i + 1]
            depths[key] = depths.get(key, 0) + depth
            found = ages.setdefault(key, [])
            if first and depth:
                entry_ms = int(first[0][0].split(b"-")[0])
                found.append(max(0.0, (now_ms - entry_ms) / 1000.0))
        return [LaneBacklog(model, lane, depth,
                            (max(ages[(model, lane)], default=None) if depth else 0.0))
                for (model, lane), depth in depths.items()]

    async def close(self) -> None:
        await self._redis.aclose()


def loss_moment(entries: Sequence[tuple[bytes, dict[bytes, bytes]]]) -> int:
    """Epoch ms before which requests on a recreated lane were lost: see LOSS_MARGIN_MS."""
    first_ms = int(entries[0][0].split(b"-")[0])
    fresh = []
    for entry_id, fields in entries:
        enqueued = peek_header((fields or {}).get(PAYLOAD_FIELD, b"")).get("enqueued_at")
        added_ms = int(entry_id.split(b"-")[0])
        if isinstance(enqueued, float | int) and abs(added_ms - enqueued * 1000) <= LOSS_MARGIN_MS:
            fresh.append(int(enqueued * 1000))
    return min(fresh) if fresh else first_ms - LOSS_MARGIN_MS


def entries_by_stream(deliveries: Sequence[Delivery]) -> dict[bytes, list[Any]]:
    """Entry IDs grouped by stream, so a batch costs one command per stream."""
    by_stream: dict[bytes, list[Any]] = {}
    for d in deliveries:
        stream, entry_id = d.token
        by_stream.setdefault(stream, []).append(entry_id)
    return by_stream
