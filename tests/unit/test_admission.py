"""Admission control: the pure decision, and how often the cached reading is refreshed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from batchfleet.connectors.redis_pressure import RedisPressure
from batchfleet.producers.admission import Admission, AdmissionLimits, refusal
from batchfleet.schemas.errors import ConfigError, OverloadedError

pytestmark = pytest.mark.unit
LANE = ("demo-mlp", "interactive")
MB = 1 << 20


def _reading(used: int = MB, limit: int = 10 * MB, depth: int = 0,
             policy: str = "noeviction") -> RedisPressure:
    return RedisPressure(used, limit, policy, {LANE: depth})


def test_admits_below_the_memory_mark_and_refuses_at_it() -> None:
    limits = AdmissionLimits(max_memory=0.8)
    assert refusal([_reading(used=7 * MB)], LANE, limits) is None
    reason = refusal([_reading(used=8 * MB)], LANE, limits)
    assert reason is not None and "80%" in reason


def test_no_maxmemory_means_no_memory_limit() -> None:
    assert refusal([_reading(used=50 * MB, limit=0)], LANE, AdmissionLimits()) is None


def test_any_redis_past_its_mark_refuses() -> None:
    """The broker and a separate result store are both read; either can be full."""
    readings = [_reading(used=MB), _reading(used=9 * MB)]
    assert refusal(readings, LANE, AdmissionLimits()) is not None


def test_backlog_mark_is_per_lane_and_off_by_default() -> None:
    deep = _reading(depth=5000)
    assert refusal([deep], LANE, AdmissionLimits()) is None
    limits = AdmissionLimits(max_backlog=5000)
    assert "5000 queued" in (refusal([deep], LANE, limits) or "")
    assert refusal([deep], ("demo-mlp", "bulk"), limits) is None


def test_marks_are_validated() -> None:
    with pytest.raises(ConfigError):
        AdmissionLimits(max_memory=1.5).validated()
    with pytest.raises(ConfigError):
        AdmissionLimits(max_backlog=-1).validated()


def test_eviction_policy_safety() -> None:
    assert _reading(policy="noeviction").eviction_safe
    assert _reading(policy="volatile-lru").eviction_safe
    assert not _reading(policy="allkeys-lru").eviction_safe


class _Reader:
    def __init__(self, reading: RedisPressure) -> None:
        self.reading = reading
        self.calls = 0

    async def __call__(self, lanes: Sequence[tuple[str, str]]) -> list[RedisPressure]:
        self.calls += 1
        return [self.reading]


async def test_reading_is_cached_for_the_refresh_interval() -> None:
    now = [0.0]
    reader = _Reader(_reading())
    admission = Admission(AdmissionLimits(refresh_s=0.5), reader, clock=lambda: now[0])
    for _ in range(100):
        await admission.check(*LANE)
    assert reader.calls == 1
    now[0] = 0.6
    await admission.check(*LANE)
    assert reader.calls == 2
    await admission.check("demo-mlp", "bulk")  # a lane not read yet is read at once
    assert reader.calls == 3


async def test_a_thousand_admitted_force_an_early_reading() -> None:
    """A fast producer cannot run far past the mark on a reading that is not yet stale."""
    now = [0.0]
    reader = _Reader(_reading(used=5 * MB))
    admission = Admission(AdmissionLimits(refresh_after=1000), reader, clock=lambda: now[0])
    await admission.check(*LANE, count=1000)
    reader.reading = _reading(used=9 * MB)
    with pytest.raises(OverloadedError) as refused:
        await admission.check(*LANE, count=1000)
    assert reader.calls == 2 and refused.value.retryable and refused.value.retry_after_s >= 1


async def test_disabled_marks_never_read() -> None:
    reader = _Reader(_reading(used=10 * MB))
    admission = Admission(AdmissionLimits(max_memory=0, max_backlog=0), reader)
    await admission.check(*LANE)
    assert reader.calls == 0
