"""Admission control: refuse new work while Redis is nearly full or a lane is too deep.

Why: with ``noeviction`` a Redis at ``maxmemory`` refuses writes, result writes
included, and a stream entry is deleted only after its result is written, so a
fleet that admitted everything up to the limit could never free memory again.
Producers stop at a high-water mark below the limit instead (``OverloadedError``,
retryable; HTTP 503 with ``Retry-After`` at the gateway), which always leaves
workers room to write results and delete entries.

The reading (``INFO memory`` plus one ``XLEN`` per lane, one round trip per Redis)
is cached for ``refresh_s``, and refreshed sooner once ``refresh_after`` requests
have been admitted on it, so a check costs no round trip per submit (one per
thousand at most) and a fast producer overshoots the mark by one chunk at most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from batchfleet.connectors.values import StorePressure
from batchfleet.schemas.errors import ConfigError, OverloadedError, ResultStoreError, TransportError

Lane = tuple[str, str]
Reader = Callable[[Sequence[Lane]], Awaitable[Sequence[StorePressure]]]


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    #: Refuse past this fraction of Redis ``maxmemory`` (0: never; no limit when Redis
    #: has no ``maxmemory``). The gateway reads it from ``BATCHFLEET_ADMIT_MAX_MEMORY``;
    #: the SDK takes only what it is given (``AsyncClient(admission=...)``).
    max_memory: float = 0.8
    #: Refuse while a lane holds this many queued requests (0: no limit, Redis Streams
    #: only). The gateway's ``BATCHFLEET_ADMIT_MAX_BACKLOG``.
    max_backlog: int = 0
    #: How long a reading is trusted.
    refresh_s: float = 0.5
    #: Admitted requests after which the reading is refreshed early.
    refresh_after: int = 1000

    def validated(self) -> AdmissionLimits:
        if not 0 <= self.max_memory <= 1 or self.max_backlog < 0 or self.refresh_s <= 0:
            raise ConfigError("admission: max_memory must be within 0..1, max_backlog not "
                              "negative, refresh_s positive")
        return self


def refusal(readings: Sequence[StorePressure], lane: Lane, limits: AdmissionLimits
            ) -> str | None:
    """Why new work for ``lane`` must be refused now, or None to admit it."""
    for reading in readings:
        fraction = reading.memory_fraction
        if limits.max_memory and fraction >= limits.max_memory:
            return (f"Redis memory at {fraction:.0%} of maxmemory, past the admission mark "
                    f"of {limits.max_memory:.0%}: retry once workers have drained some")
        depth = reading.depths.get(lane, 0)
        if limits.max_backlog and depth >= limits.max_backlog:
            return (f"lane {lane[0]}/{lane[1]} has {depth} queued requests, past the "
                    f"admission mark of {limits.max_backlog}: retry once workers catch up")
    return None


class Admission:
    """The cached reading and the check producers call before each submit or chunk."""

    def __init__(self, limits: AdmissionLimits, read: Reader,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = limits.validated()
        self._read = read
        self._clock = clock
        self._lanes: set[Lane] = set()
        self._readings: Sequence[StorePressure] = ()
        self._read_at = float("-inf")
        self._admitted = 0
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._limits.max_memory or self._limits.max_backlog)

    async def check(self, model: str, lane: str, count: int = 1) -> None:
        """Raise OverloadedError if ``count`` new requests for this lane must be refused."""
        if not self.enabled:
            return
        key = (model, lane)
        if self._due(key, count):
            async with self._lock:
                if self._due(key, count):  # another caller may have refreshed meanwhile
                    await self._refresh(key)
        reason = refusal(self._readings, key, self._limits)
        if reason is not None:
            raise OverloadedError(reason, retry_after_s=max(1.0, self._limits.refresh_s))
        self._admitted += count

    def _due(self, key: Lane, count: int) -> bool:
        return (key not in self._lanes or self._admitted + count > self._limits.refresh_after
                or self._clock() - self._read_at >= self._limits.refresh_s)

    async def _refresh(self, key: Lane) -> None:
        self._lanes.add(key)
        try:
            self._readings = await self._read(sorted(self._lanes))
        except (TransportError, ResultStoreError):
            # Unreadable Redis: admit, and let the submit itself say what is wrong.
            self._readings = ()
        self._read_at = self._clock()
        self._admitted = 0
