"""Stage stamps after ``finished_at``: bounded in the SDK, summarised by the bench."""

from __future__ import annotations

import pytest

from batchfleet.bench.samples import Sample, client_stages
from batchfleet.producers.stage_stamps import StageStamps


def test_stamps_are_popped_once_and_bounded_oldest_out() -> None:
    stamps = StageStamps(limit=3)
    stamps.record(["a", "b"], 1.0, 1.5)
    stamps.record(["c", "d"], 2.0, 2.5)
    assert len(stamps) == 3
    assert stamps.pop("a") is None  # the oldest fell out
    assert stamps.pop("d") == (2.0, 2.5)
    assert stamps.pop("d") is None


def _sample(finished: float, received: float, delivered: float, done: float) -> Sample:
    return Sample(0.0, done, "succeeded", 0.0, 0.0, 1, 0.0, finished, received, delivered)


def test_each_stage_is_its_own_difference_and_read_backs_have_none() -> None:
    samples = [_sample(10.0, 10.002, 10.003, 10.007) for _ in range(99)]
    samples.append(_sample(10.0, 0.0, 0.0, 10.5))  # read back by the poll: no stamps
    got = client_stages(samples)
    assert got["announced_frac"] == 0.99
    assert got["announce_ms"]["p50"] == pytest.approx(2.0, abs=1e-6)
    assert got["deliver_ms"]["p99"] == pytest.approx(1.0, abs=1e-6)
    assert got["wake_ms"]["p50"] == pytest.approx(4.0, abs=1e-6)


def test_no_samples_no_stages() -> None:
    assert client_stages([]) == {"announced_frac": 0.0}
