"""Announcements of finished results: the subscribe side, over Redis pub/sub.

The publish side lives inside the first-wins terminal write (``_WRITE_TERMINAL``
in ``result_store``), so an announcement is never sent for a write that lost.
A waiter subscribes to its own client's channel. A message comes in one of two
formats (docs/wire-format.md §8): (request ID, result body) pairs, for requests
that asked for them (``notify_format`` results), so the waiter needs no
read-back; or the IDs alone, comma-joined, for every other request (clients
written before one-hop delivery, and cancels), which the waiter reads back.
Pub/sub is at-most-once: callers keep a slow poll as the safety net.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import msgpack
import redis.asyncio as aioredis
import structlog
from redis.asyncio.cluster import RedisCluster

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import is_cluster, refresh_topology
from batchfleet.connectors.values import Announced
from batchfleet.schemas.errors import ResultStoreError, ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.validation import check_request_id

_CLOSE_TIMEOUT_S = 2.0

log = structlog.get_logger("batchfleet.client")


def parse_announcement(data: bytes) -> list[Announced]:
    """A msgpack array alternating request ID (str) and result body (bin), or comma-joined
    request IDs (bodies None); [] for anything else.

    The two cannot be confused: IDs are ASCII, and an array starts with a byte >= 0x90."""
    if data and data[0] < 0x80:
        try:
            ids = [check_request_id(rid) for rid in data.decode("ascii").split(",")]
            return [Announced(rid, None) for rid in ids]
        except (UnicodeDecodeError, ValidationError):
            pass
    try:
        flat = msgpack.unpackb(data, raw=False, use_list=True)
        if isinstance(flat, list) and len(flat) % 2 == 0:
            out = [Announced(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
            if all(isinstance(a.request_id, str) and isinstance(a.body, bytes) for a in out):
                return out
    except (ValueError, TypeError, msgpack.UnpackException):
        pass
    log.warning("ignoring a malformed result announcement", size=len(data))
    return []


class RedisSubscription:
    def __init__(self, pubsub: Any, sharded: bool = False) -> None:
        self._pubsub = pubsub
        self._sharded = sharded

    @wrap_errors(ResultStoreError, "result subscription lost")
    async def next(self, timeout_s: float) -> list[Announced]:
        """(request ID, result body or None) pairs of the next announcement, or [] when none came
        within ``timeout_s``. A message that is not a well-formed announcement is dropped
        with a warning: the safety poll still finds those results."""
        if self._sharded:
            message = await self._pubsub.get_sharded_message(
                ignore_subscribe_messages=True, timeout=timeout_s)
        else:
            message = await self._pubsub.get_message(timeout=timeout_s)
        if message is None or _text(message.get("type")) not in ("message", "smessage"):
            return []
        return parse_announcement(message["data"])

    async def close(self) -> None:
        """Best effort: a subscription that cannot say goodbye is dropped with its socket."""
        with contextlib.suppress(Exception):
            await bounded(self._pubsub.aclose(), _CLOSE_TIMEOUT_S)


class RedisAnnouncements:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names

    async def subscribe(self, client_id: str) -> RedisSubscription:
        sharded = is_cluster(self._redis)
        if sharded:  # SSUBSCRIBE finds the channel's node in the slot map, which a new
            # client fills on its first command: the subscription may be that command
            with wrap_errors(ResultStoreError, "cannot read the cluster's topology"):
                await cast(RedisCluster, self._redis).initialize()
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        subscription = RedisSubscription(pubsub, sharded)
        try:
            with wrap_errors(ResultStoreError, "cannot subscribe to results"):
                channel = self._names.notify_channel(client_id)
                # on a cluster: sharded pub/sub (SSUBSCRIBE), served by the channel's primary
                await (pubsub.ssubscribe(channel) if sharded else pubsub.subscribe(channel))
        except BaseException as exc:
            await subscription.close()
            if sharded and isinstance(exc, ResultStoreError):
                # The channel's primary may have failed over. Nothing else re-reads the slot
                # map of a client that only waits, so every retry would dial the dead node:
                # re-read it now, and the next attempt finds the promoted replica.
                await refresh_topology(cast(RedisCluster, self._redis))
            raise
        return subscription


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
