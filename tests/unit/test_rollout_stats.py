"""Pure parts of rollout stats: the mergeable latency histogram, output comparison and
the guard's verdict (the Redis side: tests/integration/test_rollout_stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.connectors.rollout_stats import (
    LATENCY_BOUNDS_MS,
    Histogram,
    RoleStats,
    bound_of,
    bucket_of,
    compare_outputs,
)
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.workers.middleware.rollout_guard import guard_verdict

pytestmark = pytest.mark.unit


def test_percentiles_of_merged_histograms_equal_those_of_the_pooled_samples() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.lognormal(1, 1, 500), rng.lognormal(2, 0.5, 300)
    ha, hb, pooled = Histogram(), Histogram(), Histogram()
    for v in a:
        ha.add(float(v))
    for v in b:
        hb.add(float(v))
    for v in np.concatenate([a, b]):
        pooled.add(float(v))
    ha.merge(hb)
    assert ha.counts == pooled.counts
    for q in (0.5, 0.99):
        exact = float(np.quantile(np.concatenate([a, b]), q, method="inverted_cdf"))
        got = ha.percentile(q)
        assert got is not None and bucket_of(exact) == bucket_of(got)  # exact to a bucket
    assert Histogram().percentile(0.5) is None
    assert ha.cdf()[-1][1] == 1.0


def test_buckets_cover_microseconds_to_a_minute_and_overflow() -> None:
    assert bucket_of(0.0) == 0
    assert bound_of(bucket_of(LATENCY_BOUNDS_MS[-1] * 2)) == float("inf")
    assert LATENCY_BOUNDS_MS[-1] > 60_000


def test_compare_outputs() -> None:
    same = compare_outputs(np.array([0.1, 0.9]), np.array([0.1, 0.9]))
    assert same is not None and (same.max_abs, same.sum_abs, same.argmax_agrees) == (0, 0, True)
    diff = compare_outputs(np.array([0.1, 0.9]), np.array([0.6, 0.4]))
    assert diff is not None and diff.max_abs == pytest.approx(0.5) and not diff.argmax_agrees
    named = compare_outputs({"a": np.ones(2), "b": np.zeros(1)},
                            {"b": np.zeros(1), "a": np.ones(2)})
    assert named is not None and named.elements == 3 and named.max_abs == 0
    assert compare_outputs(np.ones(2), np.ones(3)) is None  # not comparable: an error


def _stats(requests: int, errors: int, ms: float = 1.0, batches: int = 30) -> RoleStats:
    hist = Histogram()
    hist.add(ms, batches)
    return RoleStats(requests, errors, hist)


def test_guard_verdict() -> None:
    policy = RolloutPolicy("v1", canary="v2", percent=20,
                           guard=GuardThresholds(error_points=5, p99_ratio=2, min_window=500))
    assert guard_verdict(policy, _stats(2000, 0), _stats(499, 200)) is None  # window not full
    assert guard_verdict(policy, _stats(2000, 0), _stats(500, 105)) == (
        "canary error rate 21.0% vs stable 0.0% over 500 requests")
    assert guard_verdict(policy, _stats(2000, 40), _stats(500, 30)) is None  # 6% vs 2%: 4 pts
    slow = guard_verdict(policy, _stats(2000, 0, ms=1.0), _stats(500, 0, ms=5.0))
    assert slow is not None and slow.startswith("canary p99 compute ")
    few = guard_verdict(policy, _stats(2000, 0, ms=1.0), _stats(500, 0, ms=5.0, batches=3))
    assert few is None  # a p99 over three batches is one slow batch
    assert guard_verdict(RolloutPolicy("v1"), _stats(10, 0), _stats(10_000, 9_000)) is None
