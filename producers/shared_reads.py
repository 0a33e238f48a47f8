"""One read per key at a time, shared by every caller that asks while it runs.

The client caches what it reads from the registry (a model's record, whether a name is a
pipeline) for ``model_list_ttl_s``. When an entry expires under load, every submit in the
next round trip misses it at once; without sharing, each took a pooled connection of its
own for the same read, and the pool opened dozens of new ones (each paying a connect and
a handshake) in the middle of a latency-sensitive burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class SharedReads(Generic[V]):
    """``await reads.get(key, read)`` runs ``read()`` unless a read of ``key`` is in
    flight, in which case it waits for that one. A cancelled caller leaves the read
    running for the others; its failure reaches every caller that waited on it."""

    def __init__(self) -> None:
        self._in_flight: dict[str, asyncio.Future[V]] = {}

    async def get(self, key: str, read: Callable[[], Awaitable[V]]) -> V:
        pending = self._in_flight.get(key)
        if pending is None:
            pending = self._in_flight[key] = asyncio.ensure_future(read())
            pending.add_done_callback(lambda done: self._forget(key, done))
        return await asyncio.shield(pending)

    def in_flight(self) -> int:
        return len(self._in_flight)

    def _forget(self, key: str, done: asyncio.Future[V]) -> None:
        if self._in_flight.get(key) is done:
            del self._in_flight[key]
        if not done.cancelled():
            done.exception()  # retrieved, even if every waiter was cancelled meanwhile
