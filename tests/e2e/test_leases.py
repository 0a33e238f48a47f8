"""In-flight leases: entries a live worker holds behind an open breaker are never reclaimed."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.dlq import DeadLetterOps
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from tests.support.fleet import running_worker
from tests.support.models import Switchable, switchable

pytestmark = pytest.mark.e2e
CLAIM_IDLE_MS = 1000


async def test_entries_held_behind_an_open_breaker_are_not_reclaimed_or_run_twice(
        redis_url: str) -> None:
    """Two workers, both breakers open for 4x claim_idle_ms: neither reclaims the other's
    (or its own) held entries, so each ID ends with one terminal result and, if failed,
    exactly one dead letter."""
    modules = [Switchable(), Switchable()]
    common = {"claim_idle_ms": CLAIM_IDLE_MS, "breaker_failures": 2, "breaker_cooldown_s": 1.0,
              "max_attempts": 2, "max_batch_size": 8, "retry_base_s": 0.01,
              "retry_cap_s": 0.05}
    names = Names("bf")
    redis = redis_client(redis_url)
    async with running_worker(redis_url, handlers={"switch": switchable(modules[0])},
                              worker_id="lease-a", **common) as a, \
            running_worker(redis_url, handlers={"switch": switchable(modules[1])},
                           worker_id="lease-b", **common) as b, \
            AsyncClient(redis_url) as client:
        until = time.monotonic() + 4 * CLAIM_IDLE_MS / 1000
        for module in modules:
            module.broken_until = until  # a backend outage, after warm-up
        rows = np.random.default_rng(3).random((64, 10), dtype=np.float32)
        ids = await client.submit_many("switch", rows)
        most_deliveries, longest_idle_ms = 1, 0
        try:
            while time.monotonic() < until:
                for entry in await redis.xpending_range(
                        names.stream("switch", "interactive"), names.consumer_group,
                        min="-", max="+", count=1000):
                    most_deliveries = max(most_deliveries, entry["times_delivered"])
                    longest_idle_ms = max(longest_idle_ms, entry["time_since_delivered"])
                await asyncio.sleep(0.1)
        finally:
            await redis.aclose()
        results = await client.wait_many(ids, timeout=60)
        ops = DeadLetterOps(redis_url, None)
        try:
            letters = Counter(dl.request_id for dl in await ops.letters("switch"))
        finally:
            await ops.close()
    assert most_deliveries == 1  # never reclaimed: XAUTOCLAIM would have counted a delivery
    assert longest_idle_ms < CLAIM_IDLE_MS
    assert a.guards.model.trips + b.guards.model.trips >= 1  # the breakers did hold them
    assert a.stats.duplicates + b.stats.duplicates == 0  # no second copy ran or wrote
    assert {r.status for r in results} <= {"succeeded", "failed"}
    for rid, result in zip(ids, results, strict=True):
        assert letters[rid] == (1 if result.status == "failed" else 0), (rid, result.status)
    assert sum(letters.values()) == a.stats.dead_lettered + b.stats.dead_lettered
