"""Micro-batching: a batch closes when it is full or when its oldest request is due.

The decisions are pure functions of (size, oldest arrival, now) so they are
tested directly; :class:`MicroBatcher` only keeps the queues and wakes the
compute loop. Time is ``time.monotonic()`` of arrival at this worker, never a
wall clock from another machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def is_batch_ready(
    size: int, oldest_arrival: float, now: float, max_size: int, max_wait_s: float
) -> bool:
    """A group may run once it is full, or once its oldest member has waited ``max_wait_s``."""
    return size >= max_size or (size > 0 and now - oldest_arrival >= max_wait_s)


def seconds_until_due(oldest_arrival: float, now: float, max_wait_s: float) -> float:
    """How long until a not-yet-full group's deadline (0 when it is already due)."""
    return max(0.0, oldest_arrival + max_wait_s - now)


def gather_pause_s(fetched: int, max_size: int, max_wait_s: float) -> float:
    """How long to let arrivals gather before the next fetch, after one that got ``fetched``.

    Under light load each fetch returns a request or two, and a fetch (a round trip,
    a reply to parse) costs more worker CPU than the request itself. A short pause
    after a partial fetch gathers several arrivals into one. It is a quarter of
    ``max_wait_s`` at most, so it only moves requests that arrive meanwhile, and by
    less than the batching wait they accept anyway. No pause after an empty fetch
    (it already blocked) or a full one (there is more waiting).
    """
    if fetched <= 0 or fetched >= max_size:
        return 0.0
    return min(max_wait_s / 4.0, 0.002)


def pick_ready(
    groups: Mapping[K, tuple[int, float, int]], now: float, max_size: int, max_wait_s: float
) -> K | None:
    """The ready group to run next: highest priority (lowest rank) first, then the oldest.

    ``groups`` maps a key to (size, oldest arrival, priority rank). Keys themselves are
    never compared: they may hold shapes of any form.
    """
    best: tuple[int, float] | None = None
    chosen: K | None = None
    for key, (size, oldest, rank) in groups.items():
        if is_batch_ready(size, oldest, now, max_size, max_wait_s) and (
                best is None or (rank, oldest) < best):
            best, chosen = (rank, oldest), key
    return chosen


@dataclass(slots=True)
class _Group(Generic[T]):
    items: deque[tuple[float, T]] = field(default_factory=deque)


class MicroBatcher(Generic[K, T]):
    """Groups items by a key (lane, model, shape) and hands out ready batches.

    Only items with equal keys share a batch, so shape-incompatible requests
    never meet. ``next_batch`` returns on size or deadline, whichever is first.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
        priority: Callable[[K], int] = lambda key: 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_ms must not be negative")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._priority = priority
        self._groups: dict[K, _Group[T]] = {}
        self._count = 0
        self._wakeup = asyncio.Event()

    def __len__(self) -> int:
        return self._count

    def put(self, keyed_items: Iterable[tuple[K, T]]) -> None:
        now = self._clock()
        for key, item in keyed_items:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.items.append((now, item))
            self._count += 1
        self._wakeup.set()

    def sizes(self) -> dict[K, int]:
        """Items waiting per key (for the in-flight gauge)."""
        return {k: len(g.items) for k, g in self._groups.items()}

    def wake(self) -> None:
        """Make a waiting ``next_batch`` look again (used on shutdown)."""
        self._wakeup.set()

    def _state(self) -> dict[K, tuple[int, float, int]]:
        return {k: (len(g.items), g.items[0][0], self._priority(k))
                for k, g in self._groups.items()}

    def take_ready(self, *, flush: bool = False) -> tuple[K, list[T]] | None:
        """A ready batch now, or None. With ``flush`` any non-empty group counts as ready."""
        state = self._state()
        key = pick_ready(state, self._clock(), self.max_batch_size, self.max_wait_s)
        if key is None and flush and state:
            key = min(state, key=lambda k: state[k][1])
        return None if key is None else (key, self._take(key))

    def _take(self, key: K) -> list[T]:
        group = self._groups[key]
        n = min(self.max_batch_size, len(group.items))
        batch = [group.items.popleft()[1] for _ in range(n)]
        if not group.items:
            del self._groups[key]
        self._count -= n
        return batch

    async def next_batch(self, stop: asyncio.Event | None = None) -> tuple[K, list[T]] | None:
        """Wait for a ready batch. Once ``stop`` is set, flush what is left, then return None."""
        while True:
            stopping = stop is not None and stop.is_set()
            found = self.take_ready(flush=stopping)
            if found is not None or stopping:
                return found
            self._wakeup.clear()
            now = self._clock()
            timeout = min(
                (seconds_until_due(g.items[0][0], now, self.max_wait_s)
                 for g in self._groups.values()),
                default=None,
            )
            if timeout == 0.0:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)
