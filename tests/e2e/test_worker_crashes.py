"""Real worker processes, stopped gracefully or killed mid-load: nothing is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.e2e
STREAM = Names().stream("demo-mlp", "interactive")


async def _pending_of(redis_url: str, consumer: str) -> int:
    redis = redis_client(redis_url)
    try:
        for c in await redis.xinfo_consumers(STREAM, Names().consumer_group):
            if c["name"].decode() == consumer:
                return int(c["pending"])
        return 0
    finally:
        await redis.aclose()


async def _wait_until(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def _frozen_holding_work(redis_url: str, worker: WorkerProcess, timeout: float) -> int:
    """Freeze ``worker`` (SIGSTOP) at a moment it holds unacked work; returns how much.
    A kill that only followed a reading of its pending count raced its own ack: between
    the two a fast worker could ack everything and the kill leave nothing behind."""
    assert worker.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _pending_of(redis_url, worker.worker_id):
            os.kill(worker.proc.pid, signal.SIGSTOP)
            held = await _pending_of(redis_url, worker.worker_id)
            if held:
                return held
            os.kill(worker.proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.005)
    raise AssertionError("the worker never held unacked work")


async def test_sigterm_during_load_drains_acks_and_loses_nothing(redis_url: str) -> None:
    n = 20_000
    x = np.random.default_rng(3).random((n, 10), dtype=np.float32)
    first = WorkerProcess(redis_url, extra_args=("--max-batch-size", "32")).start()
    await asyncio.to_thread(first.wait_ready)
    async with AsyncClient(redis_url) as client:
        ids = await client.submit_many("demo-mlp", x)
        await _wait_until(lambda: _pending_of(redis_url, first.worker_id), 20)
        code = await asyncio.to_thread(first.terminate)
        assert code == 0, first.log_tail()
        # the graceful drain wrote and acked everything it had fetched
        assert await _pending_of(redis_url, first.worker_id) == 0
        assert "worker stopped" in first.log_path.read_text()
        done_before = sum(r is not None and r.is_terminal
                          for r in await client._waiter.fetch(ids))
        assert 0 < done_before < n, "stop must land mid-load for this test to mean anything"
        with WorkerProcess(redis_url) as second:
            await asyncio.to_thread(second.wait_ready)
            results = await client.wait_many(ids, timeout=120)
    assert all(r.status == "succeeded" for r in results)


async def test_sigkill_one_of_two_workers_the_other_reclaims_its_orphans(redis_url: str) -> None:
    n = 20_000
    x = np.random.default_rng(4).random((n, 10), dtype=np.float32)
    args = ("--claim-idle-ms", "1000", "--max-batch-size", "32")
    victim = WorkerProcess(redis_url, extra_args=args).start()
    survivor = WorkerProcess(redis_url, extra_args=args).start()
    try:
        await asyncio.to_thread(victim.wait_ready)
        await asyncio.to_thread(survivor.wait_ready)
        async with AsyncClient(redis_url) as client:
            ids = await client.submit_many("demo-mlp", x)
            orphans = await _frozen_holding_work(redis_url, victim, 20)
            victim.kill()  # frozen: it acks nothing more before it dies
            assert orphans > 0, "the kill must leave unacked work behind"
            results = await client.wait_many(ids, timeout=120)
            assert await _pending_of(redis_url, victim.worker_id) == 0  # all reclaimed
    finally:
        victim.kill()
        survivor.terminate()
    assert [r.request_id for r in results] == ids
    assert all(r.status == "succeeded" for r in results)
