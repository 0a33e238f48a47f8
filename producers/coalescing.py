"""Coalescing submits: many concurrent ``submit()`` calls, few round trips.

A service that submits one request per incoming call (the gateway, an async web
handler) would otherwise pay two round trips per request. This is group
commit: at most ``max_in_flight`` sends run at once; submits that arrive while
they do are queued and go out together, chunked, when one finishes. A lone
submit is flushed on the very next event-loop turn, so there is no added delay
when there is no concurrency, and the cost per request falls as load rises.
``submit_many`` queues a group that is never split, so small concurrent
``submit_many`` calls share round trips too.

A send may refuse some items and still send the rest (a request ID already taken by
other inputs): it returns their positions, and only the submits those items came in
fail, each with ``refuse(its refused items)``; the others sharing the send succeed.

``linger_s`` bounds how often sends start: a submit that arrives within ``linger_s`` of
the last send waits out the rest of it, with whatever else arrives meanwhile. One
``submit()`` per incoming call, arriving at thousands per second, would otherwise send
one request per round trip and spend its CPU on round trips. Below ``1 / linger_s``
submits a second nothing waits.

A linger only pays when others submit while it waits. A caller that awaits each submit
before the next (a loop of ``Client.submit``) never shares a send, and each linger only
held it: 2.6 ms a submit against 0.5 without one. So after ``IDLE_LINGERS_TO_PAUSE``
lingers in a row that gathered nothing, the next ``PROBE_EVERY`` sends that would have
lingered go at once; then one lingers again, and lingering resumes as soon as one gathers
a second group (:func:`linger_verdict`, a pure function).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

#: Lingers in a row that gathered no other group before lingering pauses.
IDLE_LINGERS_TO_PAUSE = 2
#: While paused, sends that would have lingered and go at once before one lingers again.
PROBE_EVERY = 32


def linger_verdict(groups: int, idle: int) -> tuple[int, int]:
    """After a linger whose flush found ``groups`` groups queued, following ``idle`` lingers
    in a row that gathered nothing: (idle lingers now, sends to make without lingering).
    One that gathered a second group resets the count; the count stays at the threshold
    while paused, so a probe that gathers nothing pauses again at once."""
    if groups >= 2:
        return 0, 0
    idle = min(idle + 1, IDLE_LINGERS_TO_PAUSE)
    return idle, PROBE_EVERY if idle == IDLE_LINGERS_TO_PAUSE else 0


class Coalescer(Generic[T]):
    def __init__(self, send: Callable[[list[T]], Awaitable[Collection[int] | None]],
                 chunk: int, max_in_flight: int = 2, linger_s: float = 0.0,
                 refuse: Callable[[Sequence[T]], BaseException] | None = None) -> None:
        self._send = send
        self._refuse = refuse or (lambda items: ValueError(f"{len(items)} item(s) refused"))
        self._chunk = chunk
        self._max_in_flight = max_in_flight
        self._linger_s = linger_s
        self._last_send = -math.inf
        self._in_flight = 0
        self._flush_scheduled = False
        self._idle_lingers = 0
        #: Sends that would have lingered left to go at once (lingering paused).
        self._unlingered = 0
        #: Sends that waited out a linger (read by tests).
        self.lingered = 0
        self._queued: list[tuple[Sequence[T], asyncio.Future[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> None:
        """Returns once ``item`` was sent, together with whatever queued up alongside it."""
        await self.submit_many((item,))

    async def submit_many(self, items: Sequence[T]) -> None:
        """Returns once ``items`` were sent, all in one send (a group is never split)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queued.append((items, done))
        self._schedule_flush(loop)
        await done

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queued and not self._flush_scheduled and self._in_flight < self._max_in_flight:
            self._flush_scheduled = True
            at = self._last_send + self._linger_s
            would_linger = at > loop.time()
            if would_linger and not self._unlingered:
                loop.call_at(at, self._linger_ended)
                return
            if would_linger:  # lingering is paused: one fewer send before the probe
                self._unlingered -= 1
            loop.call_soon(self._flush)

    def _take(self) -> list[tuple[Sequence[T], asyncio.Future[None]]]:
        """Whole groups, oldest first, up to ``chunk`` items (or one larger group alone)."""
        queued, count, taken = self._queued, 0, 0
        while taken < len(queued) and (not taken or count + len(queued[taken][0]) <= self._chunk):
            count += len(queued[taken][0])
            taken += 1
        chunk, self._queued = queued[:taken], queued[taken:]
        return chunk

    def _linger_ended(self) -> None:
        """A flush that waited out a linger: first judge whether the wait gathered others."""
        self.lingered += 1
        self._idle_lingers, self._unlingered = linger_verdict(len(self._queued),
                                                              self._idle_lingers)
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._queued and self._in_flight < self._max_in_flight:
            self._last_send = asyncio.get_running_loop().time()
        while self._queued and self._in_flight < self._max_in_flight:
            chunk = self._take()
            self._in_flight += 1
            task = asyncio.create_task(self._send_chunk(chunk))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_chunk(self, chunk: Sequence[tuple[Sequence[T], asyncio.Future[None]]]
                          ) -> None:
        try:
            refused = await self._send([item for items, _ in chunk for item in items])
        except BaseException as exc:  # every waiter gets the failure, none hangs
            for _, done in chunk:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._in_flight -= 1
            self._schedule_flush(asyncio.get_running_loop())
        refused_at = sorted(refused) if refused else ()
        start = 0
        for items, done in chunk:
            end = start + len(items)
            mine = [items[i - start] for i in refused_at if start <= i < end]
            start = end
            if done.done():
                continue
            if mine:
                done.set_exception(self._refuse(mine))
            else:
                done.set_result(None)
