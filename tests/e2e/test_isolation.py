"""One model's failures never pause another's lanes, against real brokers and workers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from batchfleet.dlq import DeadLetterOps
from batchfleet.producers import AsyncClient
from batchfleet.workers.models import load_model
from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN, ENCODER_VOCAB
from tests.support.fleet import running_worker
from tests.support.models import POISON, Switchable, poison_model, switchable
from tests.support.transports import Fleet

pytestmark = pytest.mark.e2e
FAST_RETRY: dict[str, Any] = {"retry_base_s": 0.01, "retry_cap_s": 0.05}


async def _paced(client: AsyncClient, model: str, rows: np.ndarray, rate: float) -> list[str]:
    """Submit one request at a time, ``rate`` a second, as independent callers would."""
    ids: list[str] = []
    start = time.monotonic()
    for i, row in enumerate(rows):
        ids.append(await client.submit(model, row))
        await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    return ids


async def test_an_encoder_flood_of_bad_tokens_never_pauses_demo_mlp(redis_url: str) -> None:
    rng = np.random.default_rng(11)
    bad = rng.integers(0, ENCODER_VOCAB, (120, ENCODER_SEQ_LEN), dtype=np.int64)
    bad[:, 5] = ENCODER_VOCAB + rng.integers(0, 5000, 120)  # token IDs >= vocab
    good = rng.random((150, 10), dtype=np.float32)
    async with running_worker(redis_url, models=("demo-mlp", "demo-encoder"),
                              breaker_failures=2, max_attempts=3, **FAST_RETRY) as worker, \
            AsyncClient(redis_url) as client:
        # 40 bad encoder requests a second for 3 s, demo-mlp traffic alongside
        bad_ids, good_ids = await asyncio.gather(
            _paced(client, "demo-encoder", bad, 40.0), _paced(client, "demo-mlp", good, 50.0))
        bad_results = await client.wait_many(bad_ids, timeout=60)
        good_results = await client.wait_many(good_ids, timeout=60)
        ops = DeadLetterOps(redis_url, None)
        try:
            letters = await ops.letters("demo-encoder")
        finally:
            await ops.close()
    for r in bad_results:  # each fails once, at intake, never retried
        assert r.status == "failed" and r.attempts == 1, r
        assert r.error is not None and r.error.type == "validation_error"
        assert r.error.retryable is False and "[0, 1024)" in r.error.message
    assert letters == []
    assert [r.status for r in good_results] == ["succeeded"] * len(good)
    assert worker.guards.model_states() == {"demo-mlp": "closed", "demo-encoder": "closed"}
    assert worker.guards.model.trips == 0
    assert worker.metrics.lane_pause_counts() == {}
    assert worker.stats.retried == 0 and worker.stats.dead_lettered == 0


async def test_a_poisoned_request_in_each_batch_never_opens_the_breaker(redis_url: str) -> None:
    rows = np.random.default_rng(12).random((6, 32, 10), dtype=np.float32)
    rows[:, 13, 0] = POISON  # one poisoned request per submitted batch
    async with running_worker(redis_url, handlers={"poison": poison_model()},
                              breaker_failures=2, max_attempts=3, **FAST_RETRY) as worker, \
            AsyncClient(redis_url) as client:
        ids: list[str] = []
        for chunk in rows:
            ids += await client.submit_many("poison", chunk)
            await asyncio.sleep(0.05)
        results = await client.wait_many(ids, timeout=60)
    failed = [r for r in results if r.status == "failed"]
    assert len(failed) == 6 and all(r.attempts == 3 for r in failed)  # retried alone, twice
    assert sum(r.status == "succeeded" for r in results) == 6 * 31
    assert worker.guards.model["poison"].trips == 0
    assert worker.metrics.lane_pause_counts() == {}


async def test_a_broken_model_pauses_only_its_own_lanes(fleet: Fleet) -> None:
    broken = Switchable()
    handlers = {"switch": switchable(broken), "demo-mlp": load_model("demo-mlp")}
    rows = np.random.default_rng(13).random((40, 10), dtype=np.float32)
    async with fleet.worker(handlers=handlers, breaker_failures=2, breaker_cooldown_s=60,
                            max_attempts=50, **FAST_RETRY) as worker, fleet.client() as client:
        broken.broken = True  # after warm-up
        await client.submit_many("switch", rows[:8])
        for _ in range(200):
            if worker.guards.model["switch"].trips:
                break
            await asyncio.sleep(0.05)
        assert worker.guards.model_states() == {"switch": "open", "demo-mlp": "closed"}
        # switch's lanes are paused; demo-mlp flows all the same
        ids = await _paced(client, "demo-mlp", rows, 40.0)
        results = await client.wait_many(ids, timeout=60)
        assert [r.status for r in results] == ["succeeded"] * len(rows)
        assert worker.metrics.lane_pause_counts() == {"switch": 1}
        assert worker.vitals()["model_breakers"] == {"switch": "open", "demo-mlp": "closed"}
        exposition = worker.metrics.exposition().decode()
        assert 'batchfleet_lane_pauses_total{model="switch"} 1.0' in exposition
