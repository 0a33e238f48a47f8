"""Redis Streams on Redis Cluster: what spans streams is split per slot.

Each lane shard stream has its own hash tag (``Names.stream`` in cluster mode), so
shards spread over the primaries, and anything that touched several streams at
once is split:

* publish: the ``XADD`` script once per slot group, all in one pipeline (one round
  trip per node);
* read: one ``XREADGROUP`` per slot group, concurrently, without blocking first; only
  when every group is empty, again with a block. A blocking read on one node cannot
  wake on another node's entries, so while several groups are read the block is capped
  at :data:`CLUSTER_BLOCK_MS`: an idle worker polls each node that often, and a request
  arriving at an idle worker waits at most that long for its read to return;
* ack: ``XACK`` + ``XDEL`` of one stream in one script call (atomic, like the
  single-node ``MULTI``), the streams of a batch in one pipeline.

Failover: replication is asynchronous, so a primary killed right after it acked a
write (an ``XADD``, a pending record, a terminal result) may take that write with it,
and the promoted replica never had it. Nothing then answers such a request. The
consumer watches the cluster's ``cluster_current_epoch`` (every
:data:`EPOCH_CHECK_S`; an election raises it) and, when it rises, notes a loss on
every lane it reads, as if the lanes had been recreated (``lane_losses``, written by
the heartbeat). Waiters then end the waits on requests enqueued before that moment
that are still pending after their grace (``RequestLostError``); those that finish
are answered as usual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from batchfleet.connectors.broker import Delivery, OutboundMessage
from batchfleet.connectors.cluster_store import slot_groups
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_streams import (
    ACK_DEL_SCRIPT,
    XADD_MANY_SCRIPT,
    RedisStreamsConsumer,
    RedisStreamsPublisher,
    entries_by_stream,
)
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import lane_loss_field

#: Longest block of one read while a worker reads several slot groups (see module doc).
CLUSTER_BLOCK_MS = 20
#: How often a consumer reads the cluster's epoch to notice a failover.
EPOCH_CHECK_S = 1.0

log = structlog.get_logger("batchfleet.redis_streams")


class ClusterStreamsPublisher(RedisStreamsPublisher):
    async def publish(self, messages: Sequence[OutboundMessage]) -> None:
        if not messages:
            return
        by_stream = self._by_stream(messages)
        streams = list(by_stream)
        pipe = self._redis.pipeline(transaction=False)
        for idx in slot_groups(streams).values():
            args: list[Any] = [self._max_len or 0]
            for i in idx:
                args += [len(by_stream[streams[i]]), *by_stream[streams[i]]]
            pipe.eval(XADD_MANY_SCRIPT, len(idx), *(streams[i] for i in idx), *args)
        with wrap_errors(TransportError, "XADD to Redis failed"):
            await pipe.execute()


class ClusterStreamsConsumer(RedisStreamsConsumer):
    _epoch: int | None = None
    _next_epoch_check = 0.0

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        if time.monotonic() >= self._next_epoch_check:
            await self._check_failover()
        return await super().fetch(max_count, timeout_s)

    async def _check_failover(self) -> None:
        """Note a loss on every lane when the cluster's epoch rose (see the module doc).
        An unreadable epoch (a node is down right now) is read again next time."""
        self._next_epoch_check = time.monotonic() + EPOCH_CHECK_S
        try:
            info = await cast(RedisCluster, self._redis).cluster_info()
        except RedisError:
            return
        epoch = int(info.get("cluster_current_epoch", 0))
        if self._epoch is not None and epoch > self._epoch:
            now_ms = int(time.time() * 1000)
            lanes = sorted({lane_loss_field(m, lane) for m, lane in self._streams.values()})
            for key in lanes:
                self.lane_losses[key] = max(now_ms, self.lane_losses.get(key, 0))
            log.warning("Redis Cluster failed over (epoch rose): writes the old primary "
                        "acked but never replicated are lost; waiters of requests still "
                        "pending from before now are told so", epoch=epoch, lanes=lanes)
        self._epoch = epoch if self._epoch is None else max(self._epoch, epoch)

    async def _read(self, streams: dict[Any, Any], count: int, block_ms: int | None) -> Any:
        """Several slot groups are read without blocking first, and only when all of them
        are empty with a (capped) block: otherwise a busy stream's entries would wait for
        every empty stream's block to run out, which capped a worker at about 50 fetches a
        second."""
        keys = list(streams)
        groups = list(slot_groups([k.decode() if isinstance(k, bytes) else k
                                   for k in keys]).values())
        if len(groups) == 1:
            return await self._read_groups(keys, streams, groups, count, block_ms)
        found = await self._read_groups(keys, streams, groups, count, None)
        if found or block_ms is None:
            return found
        return await self._read_groups(keys, streams, groups, count,
                                       min(block_ms, CLUSTER_BLOCK_MS))

    async def _read_groups(self, keys: list[Any], streams: dict[Any, Any],
                           groups: list[list[int]], count: int, block_ms: int | None
                           ) -> list[Any]:
        replies = await asyncio.gather(*(
            self._redis.xreadgroup(self._group, self._consumer,
                                   {keys[i]: streams[keys[i]] for i in idx},
                                   count=count, block=block_ms)
            for idx in groups))
        return [entry for reply in replies for entry in (reply or ())]

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        pipe = self._redis.pipeline(transaction=False)
        for stream, ids in entries_by_stream(deliveries).items():
            pipe.eval(ACK_DEL_SCRIPT, 1, stream, self._group, *ids)
        with wrap_errors(TransportError, "XACK failed"):
            await pipe.execute()
