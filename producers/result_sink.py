"""Where one ``as_completed`` call receives its results (``producers.waiting``)."""

from __future__ import annotations

import asyncio
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
