"""Where one ``as_completed`` call receives its results (``producers.waiting``)."""

from __future__ import annotations

import asyncio
import math
from collections import deque

from batchfleet.schemas.envelopes import Result


class Sink:
    """Where one ``as_completed`` call receives its results: a queue and one wake-up.

    One per call rather than one future per request ID: a result costs an append,
    and a batch of them one wake-up of the caller.
    """

    __slots__ = ("cancelled", "loss_grace_s", "lost", "ready", "started_at", "timed_out",
                 "wake")

    def __init__(self, started_at: float = 0.0, loss_grace_s: float = 0.0) -> None:
        #: Loop time the wait began, and how long an ID of it may look lost before it
        #: is given up (counted from then at the earliest: ``producers.waiting``).
        self.started_at = started_at
        self.loss_grace_s = loss_grace_s
        self.ready: deque[Result] = deque()
        self.lost: list[str] = []
        self.wake: asyncio.Future[None] | None = None
        self.cancelled = self.timed_out = False

    def deliver(self, result: Result) -> None:
        self.ready.append(result)
        self.poke()

    def lose(self, request_id: str) -> None:
        self.lost.append(request_id)
        self.poke()

    def cancel(self) -> None:
        self.cancelled = True
        self.poke()

    def time_out(self) -> None:
        self.timed_out = True
        self.poke()

    def poke(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)


class Alarms:
    """The waits' timeouts on few timers: each deadline is rounded up to the next
    ``tick_s``, and the waits due in one tick share one loop timer.

    One ``call_later`` per wait (and its cancel) cost a caller making one ``submit`` and
    one wait per request about 3 us of CPU on a 2-core host, plus a heap of tens of
    thousands of timers whose Python ``__lt__`` every push walks; here a wait costs a set
    insertion and a removal. A wait times out up to ``tick_s`` after its timeout, never
    before it.
    """

    __slots__ = ("_due", "_tick_s")

    def __init__(self, tick_s: float = 0.01) -> None:
        self._tick_s = tick_s
        #: tick -> (its timer, the sinks due then).
        self._due: dict[int, tuple[asyncio.TimerHandle, set[Sink]]] = {}

    def __len__(self) -> int:
        """Waits with a pending alarm."""
        return sum(len(sinks) for _, sinks in self._due.values())

    def set(self, loop: asyncio.AbstractEventLoop, timeout_s: float, sink: Sink) -> int:
        """Time ``sink`` out ``timeout_s`` from now, or up to one tick later; returns the
        tick to :meth:`clear` it by."""
        tick = math.ceil((loop.time() + max(0.0, timeout_s)) / self._tick_s)
        due = self._due.get(tick)
        if due is None:
            self._due[tick] = (loop.call_at(tick * self._tick_s, self._ring, tick), {sink})
        else:
            due[1].add(sink)
        return tick

    def clear(self, tick: int, sink: Sink) -> None:
        due = self._due.get(tick)
        if due is None:
            return
        timer, sinks = due
        sinks.discard(sink)
        if not sinks:
            timer.cancel()
            del self._due[tick]

    def _ring(self, tick: int) -> None:
        due = self._due.pop(tick, None)
        if due is not None:
            for sink in due[1]:
                sink.time_out()
