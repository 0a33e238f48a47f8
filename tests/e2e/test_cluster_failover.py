"""Failover on Redis Cluster: SIGKILL a primary mid-run, its replica takes over, and the
fleet carries on with no manual step.

Every request then ends with exactly one terminal result, or its waiter is told it is
lost (``RequestLostError``): replication is asynchronous, so the writes the killed
primary acked but had not yet sent to its replica are gone (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from batchfleet.producers import AsyncClient, Result
from batchfleet.schemas.errors import BatchfleetError, RequestLostError, ResultStoreError
from batchfleet.schemas.names import Names
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from tests.support.models import SlowMLP
from tests.support.redis_cluster import RedisClusterServers
from tests.support.transports import make_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow]

N, CHUNK = 2000, 50


async def _answered_or_lost(client: AsyncClient, ids: list[str], timeout_s: float
                            ) -> tuple[list[Result], list[str]]:
    """Wait for every ID: the results that came, and the IDs reported lost."""
    try:
        return await client.wait_many(ids, timeout=timeout_s), []
    except RequestLostError as exc:
        return [r for r in (exc.results or []) if r is not None], exc.request_ids


async def _get_retrying(client: AsyncClient, rid: str, within_s: float = 20.0) -> Result | None:
    """``get`` is one call with no retry of its own: a read that meets a connection the
    failover closed says so once (``ResultStoreError``), and the caller tries again."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await client.get(rid)
        except ResultStoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_killed_primary_fails_over_and_every_request_ends_once_or_is_lost(
        fresh_redis_cluster: RedisClusterServers) -> None:
    fleet = make_fleet("redis", fresh_redis_cluster.url, None)
    names = Names(fleet.namespace, cluster=True)
    victim = fresh_redis_cluster.primary_of(names.stream("demo-mlp", "interactive"))
    x = np.random.default_rng(7).random((N, 10), dtype=np.float32)
    ids = [f"fo-{i}" for i in range(N)]
    async with fleet.worker(webhooks=False, max_batch_size=64) as worker, \
            fleet.client() as client:

        async def submit_all() -> int:
            refused = 0
            for start in range(0, N, CHUNK):
                chunk = slice(start, start + CHUNK)
                while True:  # a submit refused during the failover is retried, same IDs
                    try:
                        await client.submit_many("demo-mlp", x[chunk], request_ids=ids[chunk])
                        break
                    except BatchfleetError:
                        refused += 1
                        await asyncio.sleep(0.2)
                await asyncio.sleep(0.01)
            return refused

        submitting = asyncio.create_task(submit_all())
        await asyncio.sleep(1.0)
        await asyncio.to_thread(fresh_redis_cluster.kill, victim)
        refused = await submitting
        await asyncio.to_thread(fresh_redis_cluster.wait_promoted, victim)
        results, lost = await _answered_or_lost(client, ids, 30)
        # 50 reads at a time: each holds a connection, and a cluster node's pool (100)
        # refuses more at once rather than wait (MaxConnectionsError)
        stored = [r for start in range(0, N, 50) for r in await asyncio.gather(
            *(_get_retrying(client, rid) for rid in ids[start:start + 50]))]
        # every stored result is this worker's; a result write retried across the
        # failover may find its own first attempt there and count it as a duplicate
        assert worker.stats.succeeded + worker.stats.duplicates >= len(results)
    finished = {r.request_id: r for r in results}
    assert len(finished) == len(results)  # no ID answered twice
    assert set(finished) | set(lost) == set(ids) and not set(finished) & set(lost)
    assert all(r.is_terminal for r in results)
    for rid, rec in zip(ids, stored, strict=True):  # the waiter got what the store keeps
        if rid in finished:
            assert rec is not None and rec.status == finished[rid].status
    # the run really crossed a failover, and most of it survived it
    assert fresh_redis_cluster.primaries() and victim not in fresh_redis_cluster.live_ports
    assert len(lost) < N // 4, (len(lost), refused)
    print(f"failover: {N} requests, {len(finished)} answered, {len(lost)} reported lost, "
          f"{refused} submits refused and retried during the election")


async def test_a_waiting_client_resubscribes_after_its_channels_primary_fails_over(
        fresh_redis_cluster: RedisClusterServers) -> None:
    """A client that only waits issues no other command that would re-read the slot map:
    when the primary serving its channel dies, its resubscription must find the promoted
    replica itself (it once dialled the dead node for ever, and no wait ended)."""
    fleet = make_fleet("redis", fresh_redis_cluster.url, None)
    names = Names(fleet.namespace, cluster=True)
    slow = TorchModuleHandler("slow", SlowMLP(), input_spec=TensorSpec("float32", (10,)))
    x = np.random.default_rng(9).random((400, 10), dtype=np.float32)  # ~1 s of work
    async with fleet.worker(webhooks=False, handlers={"slow": slow}, max_batch_size=8), \
            fleet.client() as client:
        victim = fresh_redis_cluster.primary_of(names.notify_channel(client.client_id))
        ids = await client.submit_many("slow", x)
        await asyncio.to_thread(fresh_redis_cluster.kill, victim)  # announcements still due
        await asyncio.to_thread(fresh_redis_cluster.wait_promoted, victim)
        results, lost = await _answered_or_lost(client, ids, 60)
    # every wait ended: answered (each once) or reported lost, none left hanging
    assert len({r.request_id for r in results}) == len(results)
    assert {r.request_id for r in results} | set(lost) == set(ids)
    assert all(r.status == "succeeded" for r in results)
