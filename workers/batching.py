"""Micro-batching: a batch closes when it is full or when its oldest request is due.

The decisions are pure functions of (size, oldest arrival, now) so they are
tested directly; :class:`MicroBatcher` only keeps the queues and wakes the
compute loop. Time is ``time.monotonic()`` of arrival at this worker, never a
wall clock from another machine.

A :class:`ClosePolicy` sets each group's due time, asked afresh at every look. The
default, :class:`FixedWait`, makes a group due once its oldest has waited
``max_wait_s``; an SLO policy (``--latency-slo-ms``: ``workers/slo.py``) is given the
group's oldest *origin* as well, the monotonic moment its request was enqueued (its
``enqueued_at`` moved onto this worker's monotonic clock, queue time before the fetch
included). Origins are kept only for a policy other than :class:`FixedWait`, which
never reads them, so the default path costs no more per request than it must.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from batchfleet.connectors.cancelling import bounded

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)


class ClosePolicy(Protocol[K_contra]):
    """Decides when a not-yet-full group closes (instead of a fixed ``max_wait_s``)."""

    def due_at(self, key: K_contra, size: int, oldest_arrival: float, oldest_origin: float,
               now: float) -> float:
        """When the group ``key`` of ``size`` should close (``<= now``: now). Arrival is when
        its oldest reached this worker, origin when its oldest-enqueued request was
        enqueued; both monotonic."""
        ...

    def batch_size(self, key: K_contra, size: int, oldest_origin: float, now: float) -> int:
        """How many of a due group's ``size`` items to take now (at most ``max_batch_size``
        are taken whatever it says; fewer than 1 counts as 1)."""
        ...

    def closed(self, key: K_contra, size: int, now: float) -> None:
        """A batch of ``size`` was taken from the group ``key`` at ``now``."""
        ...


class FixedWait(Generic[K_contra]):
    """The default close rule: a group is due once its oldest has waited ``max_wait_s``,
    and a due group gives up to a full batch. It reads no origins."""

    __slots__ = ("max_wait_s",)

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s

    def due_at(self, key: K_contra, size: int, oldest_arrival: float, oldest_origin: float,
               now: float) -> float:
        return oldest_arrival + self.max_wait_s

    def batch_size(self, key: K_contra, size: int, oldest_origin: float, now: float) -> int:
        return size

    def closed(self, key: K_contra, size: int, now: float) -> None:
        pass


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


def pick_due(groups: Mapping[K, tuple[int, float, int, float]], now: float,
             max_size: int) -> K | None:
    """:func:`pick_ready` with a due time per group: (size, oldest arrival, rank, due at)."""
    best: tuple[int, float] | None = None
    chosen: K | None = None
    for key, (size, oldest, rank, due) in groups.items():
        if (size >= max_size or (size > 0 and now >= due)) and (
                best is None or (rank, oldest) < best):
            best, chosen = (rank, oldest), key
    return chosen


def origin_of(arrival: float, enqueued_at: float, wall_now: float) -> float:
    """A request's enqueue moment on this worker's monotonic clock: its arrival less the
    time it had already queued (``enqueued_at`` is a wall clock, 0 when unknown). A
    producer clock ahead of ours counts as no queue time, never as a future origin."""
    if enqueued_at <= 0.0:
        return arrival
    return arrival - max(0.0, wall_now - enqueued_at)


@dataclass(slots=True)
class _Group(Generic[T]):
    items: deque[tuple[float, T]] = field(default_factory=deque)
    #: The earliest origin among ``items`` (only kept with a close policy).
    origin: float = math.inf


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
        *,
        policy: ClosePolicy[K] | None = None,
        enqueued_at: Callable[[T], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if max_wait_s < 0:
            raise ValueError("max_wait_ms must not be negative")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._priority = priority
        #: None: :class:`FixedWait` of ``max_wait_s``. ``enqueued_at`` gives an item's
        #: wall-clock enqueue time (for the policy's origins); ``wall_clock`` is read once
        #: per ``put``.
        self.policy: ClosePolicy[K] = FixedWait(max_wait_s) if policy is None else policy
        self._origins = not isinstance(self.policy, FixedWait)
        self._enqueued_at = enqueued_at
        self._wall_clock = wall_clock
        self._groups: dict[K, _Group[T]] = {}
        self._count = 0
        self._wakeup = asyncio.Event()

    def __len__(self) -> int:
        return self._count

    def put(self, keyed_items: Iterable[tuple[K, T]]) -> None:
        now = self._clock()
        if self._origins:
            self._put_with_origins(keyed_items, now)
            return
        for key, item in keyed_items:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.items.append((now, item))
            self._count += 1
        self._wakeup.set()

    def _put_with_origins(self, keyed_items: Iterable[tuple[K, T]], now: float) -> None:
        wall, enqueued = self._wall_clock(), self._enqueued_at
        for key, item in keyed_items:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.items.append((now, item))
            origin = now if enqueued is None else origin_of(now, enqueued(item), wall)
            group.origin = min(group.origin, origin)
            self._count += 1
        self._wakeup.set()

    def sizes(self) -> dict[K, int]:
        """Items waiting per key (for the in-flight gauge)."""
        return {k: len(g.items) for k, g in self._groups.items()}

    def wake(self) -> None:
        """Make a waiting ``next_batch`` look again (used on shutdown)."""
        self._wakeup.set()

    def _due(self, now: float) -> dict[K, tuple[int, float, int, float]]:
        """Each group's (size, oldest arrival, rank, due at), as the close policy sets it."""
        policy = self.policy
        return {k: (len(g.items), g.items[0][0], self._priority(k),
                    policy.due_at(k, len(g.items), g.items[0][0], g.origin, now))
                for k, g in self._groups.items()}

    def take_ready(self, *, flush: bool = False) -> tuple[K, list[T]] | None:
        """A ready batch now, or None. With ``flush`` any non-empty group counts as ready."""
        now = self._clock()
        key = self._pick(now, flush)
        return None if key is None else (key, self._take(key, now))

    def _pick(self, now: float, flush: bool) -> K | None:
        """:func:`pick_due` over the groups in one pass, building no table (this runs at
        every look); with ``flush`` and none due, the group with the oldest arrival."""
        due_at, rank_of, max_size = self.policy.due_at, self._priority, self.max_batch_size
        best: tuple[int, float] | None = None
        chosen: K | None = None
        oldest_key: K | None = None
        oldest_at = math.inf
        for key, group in self._groups.items():
            size, oldest = len(group.items), group.items[0][0]
            due = due_at(key, size, oldest, group.origin, now)  # asked of every group
            if size >= max_size or now >= due:
                rank = rank_of(key)
                if best is None or (rank, oldest) < best:
                    best, chosen = (rank, oldest), key
            elif oldest < oldest_at:
                oldest_key, oldest_at = key, oldest
        if chosen is None and flush:
            return oldest_key
        return chosen

    def _take(self, key: K, now: float) -> list[T]:
        group = self._groups[key]
        policy, size = self.policy, len(group.items)
        n = max(1, min(self.max_batch_size, size, policy.batch_size(key, size, group.origin, now)))
        batch = [group.items.popleft()[1] for _ in range(n)]
        if not group.items:
            del self._groups[key]
        elif self._origins:
            self._reset_origin(group)
        self._count -= n
        policy.closed(key, n, now)
        return batch

    def _reset_origin(self, group: _Group[T]) -> None:
        """The earliest origin among what is left (once per batch taken, not per request)."""
        enqueued = self._enqueued_at
        if enqueued is None:
            group.origin = group.items[0][0]
            return
        wall, mono = self._wall_clock(), self._clock()
        # origins were fixed at arrival; the wall-minus-monotonic offset is the same now
        group.origin = min(origin_of(arrival, enqueued(item), wall - mono + arrival)
                           for arrival, item in group.items)

    def seconds_until_next_due(self) -> float:
        """Seconds until the earliest group is due: 0 when one is, inf when there is none."""
        now = self._clock()
        return min((max(0.0, 0.0 if size >= self.max_batch_size else due - now)
                    for size, _, _, due in self._due(now).values()), default=math.inf)

    async def next_batch(self, stop: asyncio.Event | None = None) -> tuple[K, list[T]] | None:
        """Wait for a ready batch. Once ``stop`` is set, flush what is left, then return None."""
        while True:
            stopping = stop is not None and stop.is_set()
            found = self.take_ready(flush=stopping)
            if found is not None or stopping:
                return found
            self._wakeup.clear()
            due_in = self.seconds_until_next_due()
            timeout = None if due_in == math.inf else due_in
            if timeout == 0.0:
                continue
            with contextlib.suppress(TimeoutError):
                await bounded(self._wakeup.wait(), timeout)
