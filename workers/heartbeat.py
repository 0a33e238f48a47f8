"""A key each live worker refreshes with its vital signs; its TTL buries dead workers.

The demo and tests wait for it to know a worker is warmed up; operators read
it to see who is serving what, with which breaker states and counters.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import msgpack
import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger("batchfleet.heartbeat")

EVERY_S = 2.0
TTL_S = 10


class Heartbeat:
    def __init__(self, client: Redis, key: str, vitals: Callable[[], dict[str, Any]]) -> None:
        self._redis = client
        self._key = key
        self._vitals = vitals
        self._started = time.time()

    async def beat(self) -> None:
        info = {"host": socket.gethostname(), "started_at": self._started,
                "seen_at": time.time(), **self._vitals()}
        await self._redis.set(self._key, msgpack.packb(info), ex=TTL_S)

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except RedisError as exc:  # advisory: a missed beat must not stop the worker
                log.warning("heartbeat failed", error=str(exc))
            await asyncio.sleep(EVERY_S)

    async def forget(self) -> None:
        try:
            await self._redis.delete(self._key)
        except RedisError as exc:  # the key expires on its own
            log.info("could not remove heartbeat", error=str(exc))
