"""Pure parts of rollout stats: the mergeable latency histogram and output comparison
(the guard's verdicts: test_rollout_verdicts.py; the Redis side:
tests/integration/test_rollout_stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.connectors.rollout_stats import (
    LATENCY_BOUNDS_MS,
    Histogram,
    bound_of,
    bucket_of,
    compare_outputs,
)

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


# The guard's verdicts: tests/unit/test_rollout_verdicts.py.
