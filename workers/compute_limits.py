"""How long a batch may compute before it counts as stalled: learned per model.

No model should be able to wedge a worker for good, so there is always a limit.
Unless ``--compute-timeout-s`` sets one, each model (each version lane) learns its
own from its batch times: ``FACTOR`` times its p99 over the last ``WINDOW`` batches,
never below ``FLOOR_S``. Until ``MIN_HISTORY`` batches have run it is ``NO_HISTORY_S``:
long enough for a slow first batch, short enough that a hang is contained.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from batchfleet.workers.per_model import PerModel

FACTOR = 10.0
FLOOR_S = 10.0
NO_HISTORY_S = 120.0
MIN_HISTORY = 5
WINDOW = 256
#: The p99 is re-read every this many batches (a sort of ``WINDOW`` floats), not each one.
REFRESH_EVERY = 16


def learned_limit_s(times_s: list[float]) -> float:
    """``FACTOR`` x p99 of ``times_s``, at least ``FLOOR_S``; ``NO_HISTORY_S`` when short."""
    if len(times_s) < MIN_HISTORY:
        return NO_HISTORY_S
    ordered = sorted(times_s)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return max(FLOOR_S, FACTOR * p99)


class ComputeLimits:
    """Per version lane (``model`` or ``model@version``): its limit and its batch times."""

    def __init__(self, overrides: PerModel[float | None] | None = None) -> None:
        self._overrides: PerModel[float | None] = overrides or PerModel(None)
        self._times: dict[str, deque[float]] = {}
        self._limits: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def fixed_s(self, lane: str) -> float | None:
        """The ``--compute-timeout-s`` limit for this lane, if one is set."""
        model, _, version = lane.partition("@")
        return self._overrides.for_model(model, version or None)

    def limit_s(self, lane: str) -> float:
        fixed = self.fixed_s(lane)
        if fixed is not None:
            return fixed
        return self._limits.get(lane, NO_HISTORY_S)

    def record(self, lane: str, seconds: float) -> None:
        """A batch of ``lane`` finished within its limit in ``seconds``."""
        times = self._times.get(lane)
        if times is None:
            times = self._times[lane] = deque(maxlen=WINDOW)
        times.append(seconds)
        since = self._since.get(lane, REFRESH_EVERY) + 1
        if since >= REFRESH_EVERY or len(times) <= MIN_HISTORY:
            self._limits[lane], since = learned_limit_s(list(times)), 0
        self._since[lane] = since

    def snapshot(self, lanes: Iterable[str]) -> dict[str, float]:
        """Each lane's limit now, in seconds (``/readyz`` shows it)."""
        return {lane: round(self.limit_s(lane), 3) for lane in lanes}


def parse_limit(value: str) -> float | None:
    """``--compute-timeout-s`` value: seconds, or ``auto`` (learned; the default). ``none``
    is read as ``auto`` too: it is how settings print None (``--print-config`` must read
    back), and it once meant "no limit", which no longer exists."""
    if value.strip().lower() in ("auto", "none", ""):
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError("must be positive seconds or auto (every batch has a limit)")
    return seconds
