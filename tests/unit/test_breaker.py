from __future__ import annotations

import pytest

from workers.breaker import BreakerConfig, BreakerState, CircuitBreaker

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _breaker(**kw: float) -> tuple[CircuitBreaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    cfg = BreakerConfig(**{"consecutive_failures": 3, "cooldown_s": 5.0, **kw})  # type: ignore[arg-type]
    breaker = CircuitBreaker("model", cfg, clock,
                             lambda _n, a, b: changes.append((a.value, b.value)))
    return breaker, clock, changes


def test_trips_on_consecutive_failures_then_cools_down_to_a_single_probe() -> None:
    breaker, clock, changes = _breaker()
    for _ in range(2):
        breaker.record_failure()
    assert breaker.allow() and breaker.state is BreakerState.CLOSED
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    assert breaker.seconds_until_probe() == pytest.approx(5.0)
    clock.now = 5.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one probe at a time
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_failed_probe_reopens_for_another_cooldown() -> None:
    breaker, clock, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 6.0
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.now = 10.0
    assert breaker.state is BreakerState.OPEN
    clock.now = 11.0
    assert breaker.state is BreakerState.HALF_OPEN


def test_trips_on_error_rate_over_the_window_without_a_streak() -> None:
    breaker, _, _ = _breaker(consecutive_failures=100, failure_rate=0.5, window=10, min_calls=10)
    for i in range(9):
        (breaker.record_failure if i % 2 else breaker.record_success)()
    assert breaker.state is BreakerState.CLOSED  # under min_calls
    breaker.record_failure()  # 5 of 10 failed
    assert breaker.state is BreakerState.OPEN


def test_successes_reset_the_streak() -> None:
    breaker, _, _ = _breaker(failure_rate=1.0)
    for _ in range(10):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state is BreakerState.CLOSED


def test_a_neutral_outcome_frees_the_probe_without_deciding() -> None:
    breaker, clock, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 5.0
    assert breaker.allow() and not breaker.allow()
    breaker.record_neutral()
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow()


def test_a_late_success_while_open_does_not_close_it() -> None:
    breaker, _, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    breaker.record_success()
    assert breaker.state is BreakerState.OPEN
