"""Announcements of finished request IDs: the subscribe side, over Redis pub/sub.

The publish side lives inside the first-wins terminal write (``_WRITE_TERMINAL``
in ``result_store``), so an announcement is never sent for a write that lost.
A waiter subscribes to its own client's channel; each message is a batch of IDs.
Pub/sub is at-most-once: callers keep a slow poll as the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

_CLOSE_TIMEOUT_S = 2.0


class RedisSubscription:
    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    @wrap_errors(ResultStoreError, "result subscription lost")
    async def next(self, timeout_s: float) -> list[str]:
        """IDs of the next announcement, or [] when none came within ``timeout_s``."""
        message = await self._pubsub.get_message(timeout=timeout_s)
        if message is None or message.get("type") != "message":
            return []
        return list(message["data"].decode().split(","))

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
