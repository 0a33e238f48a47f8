"""Retries, the DLQ, replay and the circuit breaker, against a real Redis and real workers."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from batchfleet.dlq import DeadLetterOps
from producers import AsyncClient
from tests.support.fleet import running_worker
from tests.support.models import POISON, Switchable, switchable

pytestmark = pytest.mark.e2e
FAST_RETRY = {"retry_base_s": 0.01, "retry_cap_s": 0.05}


def _rows(n: int, poison_at: list[int]) -> np.ndarray:
    rows = np.random.default_rng(5).random((n, 10), dtype=np.float32)
    rows[poison_at, 0] = POISON
    return rows


async def test_bisection_isolates_poison_and_exhausted_requests_land_in_the_dlq(
        redis_url: str) -> None:
    poison_at = list(range(50, 1000, 95))[:10]
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              max_attempts=2, max_batch_size=64, **FAST_RETRY) as worker, \
            AsyncClient(redis_url) as client:
        ids = await client.submit_many("switch", _rows(1000, poison_at))
        results = await client.wait_many(ids, timeout=60)
        ops = DeadLetterOps(redis_url, None)
        try:
            letters = await ops.letters("switch")
        finally:
            await ops.close()
    failed = [i for i, r in enumerate(results) if r.status == "failed"]
    assert failed == poison_at
    assert sum(r.status == "succeeded" for r in results) == 990
    for i in poison_at:
        assert results[i].attempts == 2 and results[i].error is not None
        assert results[i].error.type == "model_error"
        assert "dead-lettered after attempt 2" in results[i].error.message
    assert sorted(dl.request_id for dl in letters) == sorted(ids[i] for i in poison_at)
    assert all(len(dl.errors) == 2 and dl.attempts == 2 for dl in letters)
    assert worker.stats.dead_lettered == 10 and worker.stats.retried == 10


async def test_open_breaker_stops_pulling_so_attempts_do_not_climb(redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              max_attempts=50, breaker_failures=3, breaker_cooldown_s=0.5,
                              max_batch_size=8, **FAST_RETRY) as worker, \
            AsyncClient(redis_url) as client:
        model.broken_until = time.monotonic() + 3.0  # fails for 3 s, after warm-up
        model.calls = 0
        ids = await client.submit_many("switch", _rows(200, []))
        for _ in range(100):  # the breaker opens within the 3 s the model is broken
            if worker.guards.model.trips:
                break
            await asyncio.sleep(0.05)
        assert worker.guards.model.trips >= 1
        results = await client.wait_many(ids, timeout=60)
    assert all(r.status == "succeeded" for r in results)
    # While open, only probe batches ran. Without the breaker, with 10 ms backoff, every
    # request would have been tried dozens of times in those 3 s.
    retried = [r for r in results if r.attempts > 1]
    assert len(retried) <= 8 * 12, len(retried)
    assert max(r.attempts for r in results) < 10


async def test_dlq_replay_after_fixing_the_model_supersedes_the_failure(redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              max_attempts=2, breaker_failures=1000, **FAST_RETRY), \
            AsyncClient(redis_url) as client:
        model.broken = True  # a bad deploy, after warm-up
        ids = await client.submit_many("switch", _rows(20, []))
        first = await client.wait_many(ids, timeout=30)
        assert {r.status for r in first} == {"failed"}
        model.broken = False  # the fix is deployed
        ops = DeadLetterOps(redis_url, None)
        try:
            report = await ops.replay(await ops.letters("switch", "model_error"))
            assert len(report.replayed) == 20
            assert await ops.letters() == []
        finally:
            await ops.close()
        replayed = await client.wait_many(ids, timeout=30)
    assert {r.status for r in replayed} == {"succeeded"}
    assert {r.generation for r in replayed} == {1} and {r.attempts for r in replayed} == {1}


async def test_a_batch_over_the_compute_timeout_fails_and_the_worker_carries_on(
        redis_url: str) -> None:
    from tests.support.models import SLOW, Sleepy
    from workers.models import TensorSpec, TorchModuleHandler

    slow = TorchModuleHandler("slow", Sleepy(), input_spec=TensorSpec("float32", (10,)))
    async with running_worker(redis_url, handlers={"slow": slow}, compute_timeout_s=0.5,
                              max_attempts=1), AsyncClient(redis_url) as client:
        stuck = await client.submit("slow", np.full(10, SLOW, np.float32))
        timed_out = await client.wait(stuck, timeout=10)
        fine = await client.wait_many(
            await client.submit_many("slow", np.full((20, 10), 0.5, np.float32)), timeout=10)
    assert timed_out.status == "failed" and timed_out.error is not None
    assert timed_out.error.type == "timeout" and "longer than 0.5s" in timed_out.error.message
    assert {r.status for r in fine} == {"succeeded"}
