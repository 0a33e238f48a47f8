"""Kafka-specific fleet behaviour: crashes, rebalances and committed offsets."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.support.transports import Fleet, make_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


@pytest.fixture
def kafka_fleet(redis_url: str, kafka_broker: str) -> Fleet:
    return make_fleet("kafka", redis_url, kafka_broker)


def _final_stats(log: str) -> dict[str, int]:
    """The counters a worker logs as it stops."""
    for line in reversed(log.splitlines()):
        if '"worker stopped"' in line:
            return json.loads(line)  # type: ignore[no-any-return]
    raise AssertionError(f"no 'worker stopped' line in:\n{log[-2000:]}")


async def test_sigkill_one_of_two_kafka_workers_everything_completes(kafka_fleet: Fleet) -> None:
    rows = np.random.default_rng(8).random((20_000, 10), dtype=np.float32)
    victim, survivor = kafka_fleet.process().start(), kafka_fleet.process().start()
    try:
        await asyncio.to_thread(victim.wait_ready)
        await asyncio.to_thread(survivor.wait_ready)
        async with kafka_fleet.client() as client:
            ids = await client.submit_many("demo-mlp", rows)
            await asyncio.sleep(0.5)
            victim.kill()
            results = await client.wait_many(ids, timeout=120)
    finally:
        victim.kill()
        survivor.terminate()
    assert [r.request_id for r in results] == ids
    assert all(r.status == "succeeded" for r in results)


async def test_a_third_worker_joining_mid_stream_loses_nothing(kafka_fleet: Fleet) -> None:
    rows = np.random.default_rng(9).random((30_000, 10), dtype=np.float32)
    first, second = kafka_fleet.process().start(), kafka_fleet.process().start()
    third = kafka_fleet.process()
    try:
        await asyncio.to_thread(first.wait_ready)
        await asyncio.to_thread(second.wait_ready)
        async with kafka_fleet.client() as client:
            ids = await client.submit_many("demo-mlp", rows)
            third.start()  # joins while the others are mid-stream: a rebalance
            results = await client.wait_many(ids, timeout=120)
            await asyncio.to_thread(third.wait_ready)
    finally:
        codes = [w.terminate() for w in (first, second, third)]
    assert all(r.status == "succeeded" for r in results)
    assert codes == [0, 0, 0]


async def test_committed_offsets_survive_a_restart(kafka_fleet: Fleet) -> None:
    rows = np.random.default_rng(10).random((5000, 10), dtype=np.float32)
    async with kafka_fleet.client() as client:
        with kafka_fleet.process() as first:
            await asyncio.to_thread(first.wait_ready)
            ids = await client.submit_many("demo-mlp", rows)
            await client.wait_many(ids, timeout=60)
        assert first.proc is not None and first.proc.returncode == 0
        with kafka_fleet.process() as second:
            await asyncio.to_thread(second.wait_ready)
            more = await client.submit_many("demo-mlp", rows[:100])
            assert all(r.status == "succeeded" for r in await client.wait_many(more, 60))
    first_stats = _final_stats(first.log_path.read_text())
    second_stats = _final_stats(second.log_path.read_text())
    assert first_stats["succeeded"] == 5000
    # the restarted worker resumed from the committed offsets: only the new requests ran
    assert second_stats["computed"] == 100 and second_stats["duplicates"] == 0
