"""One default AsyncClient under many concurrent submits queues on its Redis pool
instead of failing "Too many connections" (issue 23 #7), and a wait for a connection
that runs out fails with an error that says so."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import ModelVersion, TensorSpec
from tests.support.seams import open_result_store

pytestmark = pytest.mark.integration
NS = "cp"


async def _serve_demo_mlp(url: str) -> None:
    """Registered as served, so every submit's model check reads the registry."""
    store = open_result_store(url, Names(NS))
    try:
        await RedisModelRegistry(store.redis, store.names).serve(
            "w1", {"demo-mlp": [ModelVersion("default", "v1", TensorSpec("float32", (10,)))]})
    finally:
        await store.close()


async def test_500_concurrent_submits_and_reads_from_one_default_client_all_succeed(
        redis_url: str) -> None:
    await _serve_demo_mlp(redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with AsyncClient(redis_url, namespace=NS) as client:
            ids = await asyncio.gather(*(client.submit("demo-mlp", [float(i)] * 10)
                                         for i in range(500)))
            assert len(set(ids)) == 500
            # 500 concurrent reads: one connection each while it runs
            assert all(r is not None and r.status == "pending" for r in await asyncio.gather(
                *(client.get(rid) for rid in ids)))
            # bounded: the store's pool and the publisher's, plus this test's connection
            assert len(await raw.client_list()) <= 2 * 100 + 1
        assert await raw.xlen(Names(NS).stream("demo-mlp", "interactive")) == 500
    finally:
        await raw.aclose()


async def test_a_wait_for_a_connection_that_runs_out_says_why(redis_url: str) -> None:
    # one connection, held by the result subscription: a submit can only wait for it
    async with AsyncClient(redis_url, namespace=NS, check_model=False,
                           redis_max_connections=1, redis_pool_timeout_s=0.3) as client:
        await client._waiter.start()
        with pytest.raises(ResultStoreError, match="no Redis connection came free within "
                                                   r"0.3s: all 1 of this client's pool"):
            await client.get("anything")


async def _calls(raw: aioredis.Redis, command: str) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_burst_after_the_registry_cache_expires_reads_it_once(redis_url: str) -> None:
    """Every submit of a burst finds the model and pipeline entries expired together: one
    read of each is shared, and the pool opens no connection per waiting submit."""
    await _serve_demo_mlp(redis_url)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with AsyncClient(redis_url, namespace=NS, model_list_ttl_s=0.2) as client:
            await client.submit("demo-mlp", [0.0] * 10)  # warm: script loaded, entries read
            connections = len(await raw.client_list())
            await asyncio.sleep(0.3)  # both entries expire
            gets, hgetalls = await _calls(raw, "get"), await _calls(raw, "hgetall")
            ids = await asyncio.gather(*(client.submit("demo-mlp", [float(i)] * 10)
                                         for i in range(200)))
            assert len(set(ids)) == 200
            assert await _calls(raw, "get") - gets == 1  # is "demo-mlp" a pipeline?
            assert await _calls(raw, "hgetall") - hgetalls == 1  # its registry record
            # the registry read and the coalesced sends: a handful, not one per submit
            assert len(await raw.client_list()) <= connections + 3
    finally:
        await raw.aclose()
