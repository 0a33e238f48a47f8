"""Announcements of finished results: the subscribe side, over Redis pub/sub.

The publish side lives inside the first-wins terminal write (``_WRITE_TERMINAL``
in ``result_store``), so an announcement is never sent for a write that lost.
A waiter subscribes to its own client's channel; each message is a batch of
(request ID, result body) pairs, so the waiter needs no read-back. Pub/sub is
at-most-once: callers keep a slow poll as the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, NamedTuple

import msgpack
import redis.asyncio as aioredis
import structlog

from batchfleet.connectors.errors import wrap_errors
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

_CLOSE_TIMEOUT_S = 2.0

log = structlog.get_logger("batchfleet.client")


class Announced(NamedTuple):
    request_id: str
    body: bytes


def parse_announcement(data: bytes) -> list[Announced]:
    """A msgpack array alternating request ID (str) and result body (bin); [] if not."""
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
    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    @wrap_errors(ResultStoreError, "result subscription lost")
    async def next(self, timeout_s: float) -> list[Announced]:
        """(request ID, result body) pairs of the next announcement, or [] when none came
        within ``timeout_s``. A message that is not a well-formed announcement is dropped
        with a warning: the safety poll still finds those results."""
        message = await self._pubsub.get_message(timeout=timeout_s)
        if message is None or message.get("type") != "message":
            return []
        return parse_announcement(message["data"])

    async def close(self) -> None:
        """Best effort: a subscription that cannot say goodbye is dropped with its socket."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._pubsub.aclose(), _CLOSE_TIMEOUT_S)


class RedisAnnouncements:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names

    async def subscribe(self, client_id: str) -> RedisSubscription:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        subscription = RedisSubscription(pubsub)
        try:
            with wrap_errors(ResultStoreError, "cannot subscribe to results"):
                await pubsub.subscribe(self._names.notify_channel(client_id))
        except BaseException:
            await subscription.close()
            raise
        return subscription
