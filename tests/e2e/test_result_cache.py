"""The result cache (docs/cache.md) against a real Redis: repeats answered with ``cached``
and identical outputs, twins in one batch computed once, never across versions or bytes,
the opt-out, and a cache store that fails degrading to misses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchfleet.connectors import BrokerURL
from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.connectors.fleet import FleetReader
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.result_cache import RedisResultCache
from batchfleet.connectors.urls import results_url_for
from batchfleet.schemas.envelopes import Result
from batchfleet.status import cache_cell
from batchfleet.workers import Worker, WorkerSettings
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.middleware.metrics import Metrics
from batchfleet.workers.middleware.result_cache import CachedResults
from batchfleet.workers.per_model import PerModel
from tests.support.counting_model import Counting, counting_model
from tests.support.fleet import running_worker
from tests.support.transports import Fleet, make_fleet

pytestmark = pytest.mark.e2e

MODEL = "counting"
ON = PerModel(3600)


@pytest.fixture
def fleet(redis_url: str) -> Fleet:
    return make_fleet("redis", redis_url, None)


def _rows(seed: int, n: int) -> np.ndarray:
    """Rows whose first feature is in [1, 2): never a warm-up row (zeros)."""
    x = np.random.default_rng(seed).random((n, 10), dtype=np.float32)
    x[:, 0] += 1.0
    return x


def _metric(worker: Worker, name: str) -> float:
    for family in text_string_to_metric_families(worker.metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == MODEL:
                return float(sample.value)
    return 0.0


async def _wait(client: Any, ids: list[str]) -> list[Result]:
    results: list[Result] = await client.wait_many(ids, timeout=30)
    assert [r.status for r in results] == ["succeeded"] * len(ids), [r.error for r in results]
    return results


async def test_repeats_come_from_the_cache_and_twins_compute_once(fleet: Fleet) -> None:
    module = Counting()
    x = _rows(1, 4)
    async with running_worker(fleet.broker, fleet.results, {MODEL: counting_model(module)},
                              namespace=fleet.namespace, cache_ttl_s=ON,
                              max_wait_ms=200) as worker, fleet.client() as client:
        # each row twice, in one batch: four rows computed, four twins answered from them
        first = await _wait(client, await client.submit_many(MODEL, np.concatenate([x, x])))
        assert len(module.rows()) == 4
        assert not any(r.cached for r in first)
        for a, b in zip(first[:4], first[4:], strict=True):
            np.testing.assert_array_equal(a.outputs, b.outputs)
        # the same inputs again: answered from the cache, not computed
        again = await _wait(client, await client.submit_many(MODEL, x))
        assert len(module.rows()) == 4
        assert all(r.cached for r in again)
        for hit, computed in zip(again, first[:4], strict=True):
            np.testing.assert_array_equal(hit.outputs, computed.outputs)
            assert hit.model_version == computed.model_version != ""
            assert hit.compute_ms == 0.0
        # one bit different is another key: computed
        nudged = x[:1].copy()
        nudged[0, 5] = np.nextafter(nudged[0, 5], np.float32(2))
        (other,) = await _wait(client, await client.submit_many(MODEL, nudged))
        assert not other.cached and len(module.rows()) == 5
        c = worker.find(CachedResults).counts
        assert (c.hits, c.coalesced, c.misses, c.errors) == (4, 4, 5, 0)
        assert c.saved_s > 0
        assert _metric(worker, "batchfleet_cache_hits_total") == 4
        assert _metric(worker, "batchfleet_cache_coalesced_total") == 4
        assert _metric(worker, "batchfleet_cache_misses_total") == 5
        assert _metric(worker, "batchfleet_cache_saved_compute_seconds_total") > 0
        # the heartbeat carries it to `batchfleet status`
        broker = BrokerURL.parse(fleet.broker)
        reader = FleetReader(broker, results_url_for(broker, fleet.results), fleet.names)
        try:
            deadline = time.monotonic() + 10
            while True:
                snap = await reader.read()
                counters = snap.workers[0].counters if snap.workers else {}
                if counters.get("cache_hits") == 4 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            await reader.close()
        assert counters["cache_hits"] == 4 and counters["cache_misses"] == 5
        assert cache_cell(counters).startswith("62% · ")  # 8 of 13 without compute


async def test_a_request_can_opt_out(fleet: Fleet) -> None:
    module = Counting()
    x = _rows(2, 1)
    async with running_worker(fleet.broker, fleet.results, {MODEL: counting_model(module)},
                              namespace=fleet.namespace, cache_ttl_s=ON), \
            fleet.client() as client:
        # opted out: neither stored...
        (a,) = await _wait(client, await client.submit_many(MODEL, x, cache=False))
        (b,) = await _wait(client, [await client.submit(MODEL, x[0])])
        assert not a.cached and not b.cached and len(module.rows()) == 2
        # ...nor read, while the entry (stored by b) is there for everyone else
        (c,) = await _wait(client, [await client.submit(MODEL, x[0], cache=False)])
        (d,) = await _wait(client, [await client.submit(MODEL, x[0])])
        assert not c.cached and d.cached and len(module.rows()) == 3
        np.testing.assert_array_equal(c.outputs, d.outputs)


async def test_a_new_version_never_reads_an_old_entry(fleet: Fleet) -> None:
    x = np.random.default_rng(3).random((3, 10), dtype=np.float32)
    options: dict[str, Any] = {"namespace": fleet.namespace, "cache_ttl_s": ON}
    async with running_worker(fleet.broker, fleet.results, models=("demo-mlp",),
                              **options), fleet.client() as client:
        old = await _wait(client, await client.submit_many("demo-mlp", x))
        hits = await _wait(client, await client.submit_many("demo-mlp", x))
        assert all(r.cached for r in hits)
    # the same name and label, other weights: a new model_version, so new keys
    async with running_worker(fleet.broker, fleet.results, models=("demo-mlp=demo-mlp:seed=2",),
                              **options), fleet.client() as client:
        new = await _wait(client, await client.submit_many("demo-mlp", x))
        assert not any(r.cached for r in new)
        assert {r.model_version for r in new}.isdisjoint({r.model_version for r in old})
        assert not any(np.array_equal(a.outputs, b.outputs)  # type: ignore[arg-type]
                       for a, b in zip(old, new, strict=True))
        again = await _wait(client, await client.submit_many("demo-mlp", x))
        assert all(r.cached for r in again)
        assert {r.model_version for r in again} == {r.model_version for r in new}


async def _command_stats(url: str) -> dict[str, Any]:
    client = redis_client(url)
    try:
        stats: dict[str, Any] = await client.info("commandstats")
    finally:
        await client.aclose()
    keys = await _ttls(url)
    assert keys and all(3500 < ttl <= 3600 for ttl in keys)
    return stats


async def _ttls(url: str) -> list[int]:
    client = redis_client(url)
    try:
        return [await client.ttl(key) async for key in client.scan_iter("*:cache:*")]
    finally:
        await client.aclose()


@asynccontextmanager
async def _worker_caching_in(fleet: Fleet, cache_url: str, module: Counting
                             ) -> AsyncIterator[Worker]:
    """A worker whose cache lives on another Redis (which the test can kill)."""
    settings = WorkerSettings.from_url(fleet.broker, fleet.results, namespace=fleet.namespace,
                                       device="cpu", cache_ttl_s=ON, max_wait_ms=200)
    chain = default_middleware(settings, [MODEL])
    at = next(i for i, m in enumerate(chain) if isinstance(m, CachedResults))
    metrics = next(m for m in chain if isinstance(m, Metrics)).metrics
    chain[at] = CachedResults(ON, metrics, RedisResultCache(redis_client(cache_url),
                                                            fleet.names))
    worker = Worker(settings, {MODEL: counting_model(module)}, middleware=chain)
    task = asyncio.create_task(worker.async_run())
    await asyncio.wait_for(worker.ready.wait(), 60)
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)


async def test_cache_store_errors_degrade_to_misses(fleet: Fleet,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    module = Counting()
    x = _rows(4, 3)
    with EmbeddedRedis() as cache_server:
        async with _worker_caching_in(fleet, cache_server.url, module) as worker, \
                fleet.client() as client:
            await _wait(client, await client.submit_many(MODEL, x))
            hits = await _wait(client, await client.submit_many(MODEL, x))
            assert all(r.cached for r in hits) and len(module.rows()) == 3
            # one MGET per batch (two batches), each new output SET once (with its TTL)
            stats = await _command_stats(cache_server.url)
            assert stats["cmdstat_mget"]["calls"] == 2 and stats["cmdstat_set"]["calls"] == 3
            cache_server.kill()
            # the cache is gone: every request still succeeds, computed
            again = await _wait(client, await client.submit_many(MODEL, x))
            assert not any(r.cached for r in again) and len(module.rows()) == 6
            for a, b in zip(hits, again, strict=True):
                np.testing.assert_array_equal(a.outputs, b.outputs)
            fresh = await _wait(client, await client.submit_many(MODEL, _rows(5, 2)))
            assert len(fresh) == 2 and len(module.rows()) == 8
            c = worker.find(CachedResults).counts
            # each failing batch counts its lookup and its store
            assert c.errors >= 2 and c.hits == 3
            assert _metric(worker, "batchfleet_cache_errors_total") == c.errors
    assert capsys.readouterr().out.count("result cache unavailable") == 1  # logged once
