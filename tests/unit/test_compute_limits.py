"""The learned compute limit: 10x p99, at least 10 s, 120 s until there is history."""

from __future__ import annotations

import pytest

from batchfleet.workers.compute_limits import (
    FLOOR_S,
    MIN_HISTORY,
    NO_HISTORY_S,
    ComputeLimits,
    learned_limit_s,
    parse_limit,
)
from batchfleet.workers.per_model import PerModel

pytestmark = pytest.mark.unit


def test_no_history_then_floor_then_ten_times_p99() -> None:
    assert learned_limit_s([0.01] * (MIN_HISTORY - 1)) == NO_HISTORY_S
    assert learned_limit_s([0.01] * MIN_HISTORY) == FLOOR_S
    times = [1.5] * 99 + [9.0]  # p99 of 100 is the 99th: 1.5 s; the one outlier is not it
    assert learned_limit_s(times) == pytest.approx(10 * 1.5)
    assert learned_limit_s([2.0] * 50) == pytest.approx(20.0)  # no cap once learned


def test_limits_are_per_lane_and_an_override_wins() -> None:
    limits = ComputeLimits(PerModel(None, ((("slow", None), 3.0),)))
    for _ in range(MIN_HISTORY):
        limits.record("fast@default", 0.001)
        limits.record("slow@default", 5.0)
    assert limits.limit_s("fast@default") == FLOOR_S
    assert limits.limit_s("slow@default") == 3.0  # fixed: not learned
    assert limits.limit_s("new@default") == NO_HISTORY_S
    assert limits.snapshot(["fast@default", "new@default"]) == {
        "fast@default": FLOOR_S, "new@default": NO_HISTORY_S}


def test_the_learned_limit_follows_a_slower_model_within_a_refresh() -> None:
    limits = ComputeLimits()
    for _ in range(40):
        limits.record("m@default", 0.001)
    for _ in range(200):
        limits.record("m@default", 3.0)
    assert limits.limit_s("m@default") == pytest.approx(30.0)


@pytest.mark.parametrize(("raw", "value"),
                         [("auto", None), ("none", None), ("", None), ("2.5", 2.5)])
def test_parse_limit(raw: str, value: float | None) -> None:
    assert parse_limit(raw) == value


@pytest.mark.parametrize("raw", ["0", "-1", "never", "inf"])
def test_parse_limit_refuses(raw: str) -> None:
    with pytest.raises(ValueError, match="positive seconds or auto"):
        parse_limit(raw)
