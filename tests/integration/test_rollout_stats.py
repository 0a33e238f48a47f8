"""Per-version stats and shadow comparisons in a real Redis: workers' deltas merge by
addition, a newer policy epoch starts the records afresh and an older one is dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from batchfleet.connectors.rollout_stats import (
    SAMPLE_CAP,
    ComparisonDelta,
    RedisRolloutStats,
    VersionDelta,
    compare_outputs,
)
from batchfleet.schemas.names import Names
from tests.support.seams import open_result_store, rollout_stats_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def stats(redis_url: str) -> AsyncIterator[RedisRolloutStats]:
    store = open_result_store(redis_url, Names("t"))
    yield rollout_stats_for(store)
    await store.close()


def _delta(requests: int, errors: int, ms: float) -> VersionDelta:
    d = VersionDelta()
    d.add_batch(requests, errors, ms)
    return d


async def test_version_stats_merge_across_workers_per_epoch(stats: RedisRolloutStats) -> None:
    await stats.flush_versions("m", 3, {("v1", "stable"): _delta(10, 1, 2.0),
                                        ("v2", "canary"): _delta(5, 2, 8.0)})
    await stats.flush_versions("m", 3, {("v1", "stable"): _delta(30, 0, 2.0)})  # worker 2
    got = await stats.read_versions("m", ["v1", "v2", "v3"])
    stable, canary = got["v1"].role("stable"), got["v2"].role("canary")
    assert (stable.requests, stable.errors, stable.latency.total) == (40, 1, 2)
    assert (canary.requests, canary.errors, got["v2"].epoch) == (5, 2, 3)
    assert got["v3"].roles == {} and got["v3"].epoch is None
    await stats.flush_versions("m", 2, {("v1", "stable"): _delta(99, 99, 1.0)})  # stale
    assert (await stats.read_versions("m", ["v1"]))["v1"].role("stable").requests == 40
    await stats.flush_versions("m", 4, {("v1", "stable"): _delta(7, 0, 1.0)})  # new epoch
    fresh = (await stats.read_versions("m", ["v1"]))["v1"]
    assert (fresh.epoch, fresh.role("stable").requests) == (4, 7)


async def test_comparisons_merge_keep_the_max_and_bound_the_samples(
        stats: RedisRolloutStats) -> None:
    for worker_diff in (0.25, 0.5):
        d = ComparisonDelta("v1", "v2")
        for _ in range(3):
            diff = compare_outputs(np.array([0.0, 1.0]), np.array([worker_diff, 1.0]))
            assert diff is not None
            d.add(diff)
        d.skipped = 2
        d.add_latency("stable", 1.0)
        d.add_latency("shadow", 3.0)
        d.diffs += [worker_diff] * SAMPLE_CAP  # more than the cap
        await stats.flush_comparisons("m", 1, d)
    found = await stats.read_comparisons("m")
    assert found is not None
    body = found.to_json()
    assert (body["compared"], body["skipped"], body["errors"]) == (6, 4, 0)
    assert body["max_abs_diff"] == 0.5
    assert body["mean_abs_diff"] == pytest.approx((3 * 0.25 + 3 * 0.5) / 12)
    assert body["agreement_rate"] == 1.0
    assert len(found.diffs) == SAMPLE_CAP
    assert found.latency["shadow"].total == 2 and found.samples["shadow"] == [3.0, 3.0]
    assert await stats.read_comparisons("other") is None
