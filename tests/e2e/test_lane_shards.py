"""Sharded hot lanes (``--lane-shards``) on Redis Streams, with real worker processes.

The registry is seeded with K=4 before any worker runs (as a worker that served the
model with ``--lane-shards demo-mlp=4`` would have left it), so the whole backlog is
queued first and the workers' draining can be watched shard by shard.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors.fleet import FleetReader
from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.urls import BrokerURL
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names, shard_for
from batchfleet.schemas.registry import ModelVersion

pytestmark = pytest.mark.e2e
NAMES = Names()
MODEL = "demo-mlp"
SHARDS = [NAMES.stream(MODEL, "interactive", s) for s in range(4)]


async def _seed_shards(redis_url: str, k: int) -> None:
    """The record a worker with ``--lane-shards demo-mlp=K`` leaves behind."""
    registry = open_model_registry(redis_url, NAMES)
    try:
        await registry.serve("seed", {MODEL: [ModelVersion("default", "seed")]},
                             lane_shards={MODEL: k})
        await registry.withdraw("seed", [MODEL])
    finally:
        await registry.close()


async def _depths(redis_url: str) -> list[int]:
    """Every shard's length at one instant (MULTI)."""
    redis = redis_client(redis_url)
    try:
        pipe = redis.pipeline(transaction=True)
        for stream in SHARDS:
            pipe.xlen(stream)
        return [int(n) for n in await pipe.execute()]
    finally:
        await redis.aclose()


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float,
                 every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(every)
    raise AssertionError("condition not reached")


def _workers(redis_url: str, k: int, count: int) -> list[WorkerProcess]:
    args = ("--lane-shards", f"{MODEL}={k}", "--max-batch-size", "8")
    return [WorkerProcess(redis_url, extra_args=args).start() for _ in range(count)]


async def test_four_shards_two_workers_spread_drain_fairly_and_finish_once(
        redis_url: str) -> None:
    n = 2000
    await _seed_shards(redis_url, 4)
    ids = [f"shard-req-{i}" for i in range(n)]
    x = np.random.default_rng(5).random((n, 10), dtype=np.float32)
    async with AsyncClient(redis_url) as client:
        assert await client.submit_many(MODEL, x, request_ids=ids) == ids
        queued = await _depths(redis_url)
        # the producer spread them by request ID: each shard holds about a quarter
        assert sum(queued) == n
        assert all(abs(q - n / 4) <= 0.1 * n / 4 for q in queued), queued
        assert queued == [sum(shard_for(r, 4) == s for r in ids) for s in range(4)]
        # status adds the shards up
        reader = FleetReader(BrokerURL.parse(redis_url), redis_url, NAMES)
        try:
            lane = next(v for v in (await reader.read()).lanes
                        if (v.model, v.lane) == (MODEL, "interactive"))
        finally:
            await reader.close()
        assert (lane.depth, lane.shards) == (n, 4)  # no group yet: lag unknown
        assert lane.oldest_age_s is not None

        workers = _workers(redis_url, 4, 2)
        try:
            await asyncio.gather(*(asyncio.to_thread(w.wait_ready) for w in workers))
            # fairness: at half-way, every shard has been served about as much as the others
            snapshot: list[int] = []

            async def half_done() -> bool:
                snapshot[:] = await _depths(redis_url)
                return sum(snapshot) <= n // 2
            await _until(half_done, 60, every=0.005)
            served = [q - left for q, left in zip(queued, snapshot, strict=True)]
            mean = sum(served) / 4
            assert all(abs(s - mean) <= 0.1 * mean for s in served), (queued, snapshot)

            results = await client.wait_many(ids, timeout=60)
            assert [r.status for r in results] == ["succeeded"] * n
            assert all(r.attempts == 1 for r in results)
            assert await _depths(redis_url) == [0, 0, 0, 0]  # every shard drained
            redis = redis_client(redis_url)
            try:
                for stream in SHARDS:
                    assert (await redis.xpending(stream, NAMES.consumer_group))["pending"] == 0
            finally:
                await redis.aclose()
        finally:
            codes = [w.terminate() for w in workers]
        assert codes == [0, 0], [w.log_tail() for w in workers]
        # exactly once: the workers computed and wrote each request once between them
        final = [_final_counts(w) for w in workers]
        for counter in ("computed", "succeeded"):
            assert sum(int(f[counter]) for f in final) == n, final
        assert sum(int(f["duplicates"]) for f in final) == 0, final


def _final_counts(worker: WorkerProcess) -> dict[str, Any]:
    """The counters the worker logged on its way out ("worker stopped")."""
    for line in reversed(worker.log_path.read_text().splitlines()):
        if '"worker stopped"' in line:
            return dict(json.loads(line))
    raise AssertionError(f"no 'worker stopped' line:\n{worker.log_tail()}")


async def test_lowering_k_strands_nothing_and_lost_shards_heal(redis_url: str) -> None:
    m = 400
    await _seed_shards(redis_url, 4)
    x = np.random.default_rng(6).random((m, 10), dtype=np.float32)
    redis = redis_client(redis_url)
    registry = open_model_registry(redis_url, NAMES)
    try:
        async with AsyncClient(redis_url) as client:
            ids = await client.submit_many(MODEL, x)
        left = await _depths(redis_url)
        assert left[2] > 0 and left[3] > 0, left
        # a worker that now says K=2 still reads shards 2 and 3: the high-water mark is 4
        with _workers(redis_url, 2, 1)[0] as worker:
            await asyncio.to_thread(worker.wait_ready)
            async with AsyncClient(redis_url) as client:
                results = await client.wait_many(ids, timeout=60)
                assert [r.status for r in results] == ["succeeded"] * m
                assert await _depths(redis_url) == [0, 0, 0, 0]
                record = await registry.get(MODEL)
                assert record is not None
                assert (record.lane_shards, record.lane_shards_max) == (2, 4)
                # new requests go to shards 0 and 1 only
                added = [int((await redis.xinfo_stream(s))["entries-added"]) for s in SHARDS]
                more = await client.submit_many(MODEL, x[:200])
                after = [int((await redis.xinfo_stream(s))["entries-added"]) for s in SHARDS]
                assert after[2:] == added[2:]
                assert sum(after) - sum(added) == 200
                assert all(r.status == "succeeded"
                           for r in await client.wait_many(more, timeout=60))
                # a shard stream lost (evicted, deleted) is recreated with its group
                await redis.delete(SHARDS[3])

                async def healed() -> bool:
                    if not await redis.exists(SHARDS[3]):
                        return False
                    groups = await redis.xinfo_groups(SHARDS[3])
                    return any(g["name"] == NAMES.consumer_group.encode() for g in groups)
                await _until(healed, 20)
    finally:
        await registry.close()
        await redis.aclose()


async def test_lane_depth_admission_and_purge_cover_every_shard(redis_url: str) -> None:
    """What an operator runs on a sharded lane sees all of it: `lane purge`'s depth and
    purge, and the producer's admission depth, sum the K shard streams."""
    from batchfleet.connectors.request_control import open_request_control
    from tests.support.seams import open_result_store

    await _seed_shards(redis_url, 4)
    rows = np.random.default_rng(3).random((200, 10), dtype=np.float32)
    async with AsyncClient(redis_url) as client:  # no worker: everything stays queued
        ids = await client.submit_many(MODEL, rows)
        pressure = (await client._pressure([(MODEL, "interactive")]))[0]
    assert sum(await _depths(redis_url)) == 200 and min(await _depths(redis_url)) > 0
    assert pressure.depths[(MODEL, "interactive")] == 200
    store = open_result_store(redis_url, NAMES)
    control = open_request_control(BrokerURL.parse(redis_url), store)
    try:
        assert await control.lane_depths(MODEL, ["interactive"]) == {"interactive": 200}
        report = await control.purge_lane(MODEL, "interactive")
        assert sorted(report.cancelled) == sorted(ids) and report.held == 0
        assert await _depths(redis_url) == [0, 0, 0, 0]
    finally:
        await control.close()
        await store.close()
