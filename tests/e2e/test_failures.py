"""Retries, the DLQ, replay and the circuit breaker, against a real Redis and real workers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.connectors.values import DeadLetter
from batchfleet.dlq import DeadLetterOps, Selection
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import decode_request, encode_request
from batchfleet.schemas.names import Names
from tests.support.fleet import running_worker
from tests.support.models import POISON, Switchable, switchable
from tests.support.transports import Fleet

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
    """Past ``--compute-timeout-s`` the batch is split; its request that stalls again alone
    is quarantined (dead-lettered as ``stalled``), its neighbours answered."""
    from batchfleet.workers.models import TensorSpec, TorchModuleHandler
    from batchfleet.workers.per_model import PerModel
    from tests.support.models import SLOW, Sleepy

    slow = TorchModuleHandler("slow", Sleepy(), input_spec=TensorSpec("float32", (10,)))
    rows = np.full((8, 10), 0.5, np.float32)
    rows[3, 0] = SLOW
    async with running_worker(redis_url, handlers={"slow": slow}, max_wait_ms=200,
                              compute_timeout_s=PerModel(0.5)) as worker, \
            AsyncClient(redis_url) as client:
        ids = await client.submit_many("slow", rows)
        results = await client.wait_many(ids, timeout=20)
        fine = await client.wait_many(
            await client.submit_many("slow", np.full((20, 10), 0.5, np.float32)), timeout=10)
        ops = DeadLetterOps(redis_url, None)
        try:
            letters = await ops.letters("slow")
        finally:
            await ops.close()
        quarantined = worker.containment.quarantined
    stuck = results[3]
    assert stuck.status == "failed" and stuck.error is not None and not stuck.error.retryable
    assert stuck.error.type == "stalled" and "past the 0.5s limit" in stuck.error.message
    assert [r.status for r in results[:3] + results[4:]] == ["succeeded"] * 7
    assert {r.status for r in fine} == {"succeeded"}
    assert [letter.request_id for letter in letters] == [ids[3]] and quarantined == 1


async def test_two_replays_in_a_row_leave_one_letter_per_id_and_generation(
        redis_url: str) -> None:
    """Old-generation copies still parked for a retry when a replay lands are dropped
    unrun: they neither retry nor dead-letter again (50 replays once became 120 letters)."""
    model = Switchable()
    names = Names("bf")
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              max_attempts=2, breaker_failures=1000, **FAST_RETRY) as worker, \
            AsyncClient(redis_url) as client:
        model.broken = True
        ids = await client.submit_many("switch", _rows(20, []))
        assert {r.status for r in await client.wait_many(ids, timeout=30)} == {"failed"}
        ops = DeadLetterOps(redis_url, None)
        redis = redis_client(redis_url)
        schedule = RetrySchedule(redis, names)
        try:
            old = await ops.letters("switch")
            assert len((await ops.replay_selected(Selection("switch"))).replayed) == 20
            # the gen-0 copies a busy fleet would still hold, parked for their last attempt
            await schedule.add([(0.0, encode_request(replace(decode_request(dl.envelope),
                                                             attempt=2)))
                                for dl in old])
            gen1 = await _letters_at(ops, generation=1, count=20)
            model.broken = False
            first = await ops.replay_selected(Selection("switch"))
            second = await ops.replay_selected(Selection("switch"))  # right behind it
            results = await client.wait_many(ids, timeout=30)
            left = await ops.letters()
        finally:
            await ops.close()
            await redis.aclose()
    assert {(dl.request_id, dl.generation) for dl in gen1} == {(rid, 1) for rid in ids}
    assert len(first.replayed) == 20 and second.replayed == []
    assert {r.status for r in results} == {"succeeded"}
    assert {r.generation for r in results} == {2}
    assert left == []
    # every ID was dead-lettered once per failed generation (0 and 1), never more
    assert worker.stats.dead_lettered == 40
    # the parked gen-0 copies are dropped before compute: as stale, or, when one comes
    # out after its gen-2 result was written, as a duplicate; none ran (2 attempts each
    # of generations 0 and 1, then one success: 100 rows computed)
    assert worker.stats.stale + worker.stats.duplicates >= 20
    assert worker.stats.computed == 100


async def _letters_at(ops: DeadLetterOps, generation: int, count: int) -> list[DeadLetter]:
    for _ in range(300):
        letters = await ops.letters("switch")
        if sum(dl.generation == generation for dl in letters) >= count:
            await asyncio.sleep(0.3)  # room for any stale copy to dead-letter, if it could
            letters = await ops.letters("switch")
            counts = Counter((dl.request_id, dl.generation) for dl in letters)
            assert max(counts.values()) == 1, counts
            return letters
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {count} letters at generation {generation} in 15 s")


@pytest.mark.parametrize("generation", [2**53, 2**64 - 1])
async def test_a_generation_lua_cannot_compare_gets_a_failed_result_naming_it(
        fleet: Fleet, generation: int) -> None:
    """Once computed, refused by the result write (read as -1 in Lua) and acked anyway:
    now refused at intake with a failed result that lands, under generation 0."""
    body = {"v": 1, "id": f"gen-{generation}", "model": "demo-mlp", "attempt": 1,
            "generation": generation,
            "inputs": {"dtype": "float32", "shape": [10], "data": b"\0" * 40}}
    async with fleet.worker() as worker, fleet.client() as client:
        await fleet.raw_publish("demo-mlp", msgpack.packb(body))
        [result] = await client.wait_many([body["id"]], timeout=30)
    assert result.status == "failed" and result.error is not None
    assert result.error.type == "validation_error"
    assert "generation" in result.error.message and "2^53-1" in result.error.message
    assert result.generation == 0
    assert worker.stats.failed == 1 and worker.stats.computed == 0


async def test_a_request_implicated_in_a_stall_elsewhere_is_quarantined_on_its_next(
        redis_url: str) -> None:
    """Stall counts are durable: a request that stalled a batch on a worker that then died
    is quarantined the first time it stalls alone on another, not run alone again."""
    from batchfleet.workers.models import TensorSpec, TorchModuleHandler
    from batchfleet.workers.per_model import PerModel
    from tests.support.models import SLOW, Sleepy
    from tests.support.seams import open_result_store

    async with AsyncClient(redis_url, check_model=False) as client:
        rid = await client.submit("slow", np.full(10, SLOW, np.float32))
        store = open_result_store(redis_url, Names("bf"))
        try:
            assert await store.note_stalls([rid]) == [1]  # the first worker's stall
        finally:
            await store.close()
        slow = TorchModuleHandler("slow", Sleepy(), input_spec=TensorSpec("float32", (10,)))
        async with running_worker(redis_url, handlers={"slow": slow},
                                  compute_timeout_s=PerModel(0.5)) as worker:
            result = await client.wait(rid, timeout=20)
            assert worker.compute._aside is None  # quarantined without running alone again
    assert result.status == "failed" and result.error is not None
    assert result.error.type == "stalled" and "stalled compute 2 times" in result.error.message
