"""The Redis-transport pipeline on a real Redis Cluster (3 primaries, 3 replicas).

What the single-node suite proves for ``redis://`` is proved here for
``redis+cluster://`` on a representative subset: submit_many → worker → results →
wait, one-hop delivery over sharded pub/sub, sharded lanes spread over the primaries,
duplicates, and a dead letter whose record and stream sit in different slots.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.dlq import DeadLetterOps
from batchfleet.schemas.names import Names
from batchfleet.workers.per_model import PerModel
from tests.support.models import POISON, Switchable, switchable
from tests.support.redis_cluster import RedisClusterServers
from tests.support.transports import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


async def test_submit_many_to_wait_many_on_a_cluster(cluster_fleet: Fleet) -> None:
    n = 600
    x = np.random.default_rng(3).random((n, 10), dtype=np.float32)
    async with cluster_fleet.worker(webhooks=False, max_batch_size=64) as worker, \
            cluster_fleet.client() as client:
        ids = await client.submit_many("demo-mlp", x)
        results = await client.wait_many(ids, timeout=60)
        again = await client.submit_many("demo-mlp", x[:5], request_ids=ids[:5])
    assert [r.request_id for r in results] == ids and again == ids[:5]
    assert {r.status for r in results} == {"succeeded"}
    assert worker.stats.succeeded == n and worker.stats.duplicates == 0
    assert worker.stats.batches < n / 4
    names = Names(cluster_fleet.namespace, cluster=True)
    redis = redis_client(cluster_fleet.broker)
    try:  # every entry acked and deleted; records carry their hash tags
        assert await redis.xlen(names.stream("demo-mlp", "interactive")) == 0
        assert await redis.hget(names.result(ids[0]), "status") == b"succeeded"
        assert await redis.exists(f"{cluster_fleet.namespace}:result:{ids[0]}") == 0
    finally:
        await redis.aclose()


async def test_one_hop_delivery_over_sharded_pub_sub(cluster_fleet: Fleet) -> None:
    """Results arrive on the client's SSUBSCRIBE channel, bodies included: the waiter
    reads nothing back (its slow poll is pushed out of the way)."""
    x = np.random.default_rng(4).random((40, 10), dtype=np.float32)
    async with cluster_fleet.worker(webhooks=False) as _, \
            cluster_fleet.client(poll_interval_s=30) as client:
        await client.wait(await client.submit("demo-mlp", x[0]), timeout=30)  # warm
        reads = client._waiter.body_reads
        ids = await client.submit_many("demo-mlp", x)
        results = await client.wait_many(ids, timeout=20)
        assert client._waiter.body_reads == reads  # one hop: bodies came announced
    assert {r.status for r in results} == {"succeeded"}


async def test_sharded_lanes_spread_over_primaries(
        cluster_fleet: Fleet, redis_cluster_servers: RedisClusterServers) -> None:
    names = Names(cluster_fleet.namespace, cluster=True)
    owners = {redis_cluster_servers.primary_of(s)
              for s in names.shard_streams("demo-mlp", "interactive", 8)}
    assert len(owners) > 1
    x = np.random.default_rng(5).random((200, 10), dtype=np.float32)
    async with cluster_fleet.worker(webhooks=False, lane_shards=PerModel(4)) as _, \
            cluster_fleet.client() as client:
        ids = await client.submit_many("demo-mlp", x)
        results = await client.wait_many(ids, timeout=60)
    assert {r.status for r in results} == {"succeeded"}


async def test_exhausted_requests_are_dead_lettered_once_and_bad_input_fails(
        cluster_fleet: Fleet) -> None:
    """Retries go through the control-plane slot; a dead letter's record and stream sit
    in different slots (connectors/cluster_letters.py), and each lands once."""
    rows = np.random.default_rng(6).random((200, 10), dtype=np.float32)
    poison_at = [10, 77, 150]
    rows[poison_at, 0] = POISON
    async with cluster_fleet.worker(handlers={"switch": switchable(Switchable())},
                                    webhooks=False, max_attempts=2, max_batch_size=32,
                                    retry_base_s=0.01, retry_cap_s=0.05) as worker, \
            cluster_fleet.client() as client:
        ids = await client.submit_many("switch", rows)
        bad = await client.submit("switch", np.zeros(10, dtype=np.float64))
        results = await client.wait_many([*ids, bad], timeout=60)
        ops = DeadLetterOps(cluster_fleet.broker, None, cluster_fleet.namespace)
        try:
            letters = await ops.letters("switch")
        finally:
            await ops.close()
    assert [i for i, r in enumerate(results[:-1]) if r.status == "failed"] == poison_at
    assert results[-1].error is not None and results[-1].error.type == "validation_error"
    assert sorted(dl.request_id for dl in letters) == sorted(ids[i] for i in poison_at)
    assert worker.stats.dead_lettered == 3
