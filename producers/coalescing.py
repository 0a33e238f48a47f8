"""Coalescing single submits: many concurrent ``submit()`` calls, one round trip.

A service that submits one request per incoming call (the gateway, an async web
handler) would otherwise pay two round trips per request. Submits made in the
same event-loop turn are queued and sent together on the next turn, chunked,
so the cost per request falls as concurrency rises, with no added delay when
there is none: a lone submit is flushed on the very next turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalescer(Generic[T]):
    def __init__(self, send: Callable[[list[T]], Awaitable[None]], chunk: int) -> None:
        self._send = send
        self._chunk = chunk
        self._queued: list[tuple[T, asyncio.Future[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> None:
        """Returns once ``item`` was sent with whatever else was submitted this turn."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._flush)
        self._queued.append((item, done))
        await done

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        for start in range(0, len(queued), self._chunk):
            task = asyncio.create_task(self._send_chunk(queued[start:start + self._chunk]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_chunk(self, chunk: Sequence[tuple[T, asyncio.Future[None]]]) -> None:
        try:
            await self._send([item for item, _ in chunk])
        except BaseException as exc:  # every waiter gets the failure, none hangs
            for _, done in chunk:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for _, done in chunk:
            if not done.done():
                done.set_result(None)
