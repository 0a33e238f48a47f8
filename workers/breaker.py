"""A circuit breaker as a small state machine: closed, open, half-open.

It trips on ``consecutive_failures`` in a row, or when the failure rate over the
last ``window`` outcomes reaches ``failure_rate`` (once ``min_calls`` have been
seen). Open, it refuses work for ``cooldown_s``; then half-open lets exactly one
probe through, whose outcome closes or re-opens it. Time is injected so the
whole machine is tested without sleeping.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def code(self) -> int:
        """0 closed, 1 half-open, 2 open: the value exported as a metric."""
        return {"closed": 0, "half_open": 1, "open": 2}[self.value]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    consecutive_failures: int = 5
    failure_rate: float = 0.5
    window: int = 20
    min_calls: int = 10
    cooldown_s: float = 5.0


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        config: BreakerConfig = BreakerConfig(),
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState, BreakerState], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._streak = 0
        self._recent: deque[bool] = deque(maxlen=config.window)
        self._probe_out = False
        #: How many times it has opened (exported as a counter).
        self.trips = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= \
                self.config.cooldown_s:
            self._move(BreakerState.HALF_OPEN)
        return self._state

    def allow(self) -> bool:
        """May one unit of work (a batch, a write) go ahead now?"""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def probe_available(self) -> bool:
        """Half-open with its one probe not yet taken: ``allow()`` would say yes (a peek
        that takes nothing, for who answers around an open breaker)."""
        return self.state is BreakerState.HALF_OPEN and not self._probe_out

    def seconds_until_probe(self) -> float:
        if self._state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.config.cooldown_s - self._clock())

    def record_success(self) -> None:
        """Only a half-open probe's success closes the breaker; late successes while open don't."""
        self._streak = 0
        self._recent.append(True)
        self._probe_out = False
        if self.state is BreakerState.HALF_OPEN:
            self._recent.clear()
            self._move(BreakerState.CLOSED)

    def record_neutral(self) -> None:
        """An outcome that says nothing about health: free the probe slot, change nothing."""
        self._probe_out = False

    def record_failure(self) -> None:
        self._streak += 1
        self._recent.append(False)
        self._probe_out = False
        if self._state is BreakerState.HALF_OPEN or self._should_trip():
            self._opened_at = self._clock()
            self._move(BreakerState.OPEN)

    def _should_trip(self) -> bool:
        cfg = self.config
        if self._streak >= cfg.consecutive_failures:
            return True
        if len(self._recent) < cfg.min_calls:
            return False
        failures = sum(1 for ok in self._recent if not ok)
        return failures / len(self._recent) >= cfg.failure_rate

    def _move(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if new is BreakerState.OPEN and old is not new:
            self.trips += 1
        if old is not new and self._on_change is not None:
            self._on_change(self.name, old, new)
