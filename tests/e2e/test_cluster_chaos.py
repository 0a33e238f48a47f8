"""A worker SIGKILLed mid-run on Redis Cluster: its survivor reclaims the orphans.

The cluster twin of ``test_worker_crashes``' kill test, the cheapest chaos that means
something there: the victim's unacked deliveries sit in a stream's pending list on one
primary, its results in other slots, and the survivor's ``XAUTOCLAIM`` must find them
through the cluster client. Every request still ends with exactly one terminal result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.schemas.names import Names
from tests.support.transports import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow]

N = 4000


async def _until(predicate: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not reached in {timeout_s}s")


async def test_a_killed_worker_on_a_cluster_leaves_every_request_answered_once(
        cluster_fleet: Fleet) -> None:
    names = Names(cluster_fleet.namespace, cluster=True)
    stream = names.stream("demo-mlp", "interactive")
    redis = redis_client(cluster_fleet.broker)

    async def pending_of(consumer: str) -> int:
        for c in await redis.xinfo_consumers(stream, names.consumer_group):
            if c["name"].decode() == consumer:
                return int(c["pending"])
        return 0

    async def victim_busy() -> bool:
        return await pending_of(victim.worker_id) > 0

    x = np.random.default_rng(8).random((N, 10), dtype=np.float32)
    args = ("--claim-idle-ms", "1000", "--max-batch-size", "32", "--no-webhooks")
    victim = cluster_fleet.process(*args).start()
    survivor = cluster_fleet.process(*args).start()
    try:
        await asyncio.to_thread(victim.wait_ready)
        await asyncio.to_thread(survivor.wait_ready)
        async with cluster_fleet.client() as client:
            ids = await client.submit_many("demo-mlp", x)
            try:
                await _until(victim_busy, 60)
            except AssertionError as exc:  # seen once in CI: say which worker did what
                consumers = await redis.xinfo_consumers(stream, names.consumer_group)
                raise AssertionError(
                    f"{exc}: the victim never held a delivery; consumers {consumers}\n"
                    f"victim (alive {victim.alive}):\n{victim.log_tail()}\n"
                    f"survivor:\n{survivor.log_tail()}") from exc
            victim.kill()
            orphans = await pending_of(victim.worker_id)
            results = await client.wait_many(ids, timeout=120)
            stored = [await client.get(rid) for rid in ids[::97]]

            # Every result may be in before the survivor reclaims the last orphans: those
            # the victim wrote but never acked. Wait (liveness bound) for their claim+ack.
            async def reclaimed() -> bool:
                return await pending_of(victim.worker_id) == 0
            await _until(reclaimed, 30)
            left = await pending_of(victim.worker_id)
        assert survivor.alive, survivor.log_tail()
    finally:
        victim.kill()
        survivor.kill()
        await redis.aclose()
    assert orphans > 0, "the kill must leave unacked work behind"
    assert left == 0  # every orphan was reclaimed and acked
    assert [r.request_id for r in results] == ids  # one result per request, none twice
    assert {r.status for r in results} == {"succeeded"}
    assert all(rec is not None and rec.status == "succeeded" for rec in stored)
