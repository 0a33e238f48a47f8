"""Versions and worker-side routing against real Redis and real workers.

Every assertion is on versions, counts and epochs: which label computed each request
(the ``model_version`` prefix), against the deterministic choice; never on speed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from batchfleet.connectors.model_registry import RedisModelRegistry, open_model_registry
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.producers.bulk import Endpoints, JobSpec, run_job
from batchfleet.schemas.heartbeat import HeartbeatRecord
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.workers import Worker
from batchfleet.workers.middleware.routing import Routing, choose
from batchfleet.workers.models import build_mlp
from tests.support.fleet import running_worker
from tests.support.seams import control_plane_for, open_result_store, route_plane_for
from tests.support.transports import Fleet

pytestmark = pytest.mark.e2e
TWO_VERSIONS = ("demo-mlp", "demo-mlp@v2=demo-mlp:seed=2")


async def canary(registry: RedisModelRegistry, percent: float) -> RolloutPolicy:
    """v2 as canary; the automatic rollback guard set out of reach, so only these tests'
    own rollbacks change the policy (the guard has tests of its own)."""
    return await registry.set_policy("demo-mlp", stable="default", canary="v2",
                                     percent=percent, who="test", why="routing test",
                                     guard=GuardThresholds(100.0, 1e9, 10**9))


def label(model_version: str) -> str:
    return model_version.partition("/")[0]


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """A liveness bound only: the condition is what is asserted."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


@pytest.fixture
async def registry(redis_url: str) -> AsyncIterator[RedisModelRegistry]:
    reg = open_model_registry(redis_url, Names())
    yield reg
    await reg.close()


async def applied(worker: Worker, epoch: int) -> bool:
    return worker.find(Routing).epochs.get("demo-mlp", -1) >= epoch


async def heartbeats(url: str, names: Names | None = None) -> list[HeartbeatRecord]:
    store = open_result_store(url, names or Names(), 60)
    try:
        return await control_plane_for(store).heartbeats.read_all()
    finally:
        await store.close()


async def beating_with(url: str, workers: list[str], epoch: int,
                       names: Names | None = None) -> bool:
    """Every one of ``workers`` reports applying ``epoch`` (or later) in its heartbeat."""
    beats = {b.worker_id: b for b in await heartbeats(url, names)}
    return all(w in beats and beats[w].policy_epochs.get("demo-mlp", -1) >= epoch
               for w in workers)


async def test_pinning_and_a_pinned_unknown_version(redis_url: str,
                                                    registry: RedisModelRegistry) -> None:
    x = np.random.default_rng(1).random((40, 10), dtype=np.float32)
    async with running_worker(redis_url, models=TWO_VERSIONS) as worker, \
            AsyncClient(redis_url) as client:
        assert set(worker.versions["demo-mlp"]) == {"default", "v2"}
        plain = await client.wait_many(await client.submit_many("demo-mlp", x), timeout=60)
        v2 = await client.wait_many(await client.submit_many("demo-mlp", x, version="v2"),
                                    timeout=60)
        bad = await client.wait(await client.submit("demo-mlp", x[0], version="v9"), timeout=60)
    # no canary: everything unpinned goes to stable; the pin wins over the policy
    assert {label(r.model_version) for r in plain} == {"default"}
    assert {label(r.model_version) for r in v2} == {"v2"}
    assert all(r.model_version.split("/")[1].startswith("sha256:") for r in plain + v2)
    assert not np.allclose(np.stack([r.outputs for r in plain]),  # type: ignore[misc]
                           np.stack([r.outputs for r in v2]))  # type: ignore[misc]
    assert bad.status == "failed" and bad.error is not None
    assert bad.error.type == "unknown_version"
    assert "'v9'" in bad.error.message and "default, v2" in bad.error.message


async def test_a_recorded_choice_is_kept_until_a_rollback_removes_its_version(
        redis_url: str, registry: RedisModelRegistry) -> None:
    """What a redelivery sees: the version recorded at the first fetch (here recorded
    ahead, as a worker that died after fetching would have left it)."""
    x = np.random.default_rng(6).random((10,), dtype=np.float32)
    store = open_result_store(redis_url, Names(), 60)
    plane = route_plane_for(store, 60)
    try:
        async with running_worker(redis_url, models=TWO_VERSIONS) as worker, \
                AsyncClient(redis_url) as client:
            policy = await canary(registry, 1.0)
            await until(lambda: applied(worker, policy.epoch))
            ids = [f"kept-{i}" for i in range(40)]
            stable_ids = [i for i in ids if choose(policy, i) == "default"][:10]
            assert len(stable_ids) == 10
            assert await plane.settle("demo-mlp", dict.fromkeys(stable_ids, "v2")) == \
                dict.fromkeys(stable_ids, "v2")
            kept = [await client.wait(await client.submit("demo-mlp", x, request_id=rid),
                                      timeout=60) for rid in stable_ids[:5]]
            rolled = await registry.rollback("demo-mlp", who="test", why="test")
            assert rolled is not None
            await until(lambda: applied(worker, rolled.epoch))
            after = [await client.wait(await client.submit("demo-mlp", x, request_id=rid),
                                       timeout=60) for rid in stable_ids[5:]]
    finally:
        await store.close()
    assert [label(r.model_version) for r in kept] == ["v2"] * 5
    assert [label(r.model_version) for r in after] == ["default"] * 5


async def test_bulk_run_version_pins_every_row(redis_url: str, tmp_path: Path) -> None:
    x = np.random.default_rng(7).random((300, 10), dtype=np.float32)
    np.save(tmp_path / "in.npy", x)
    spec = JobSpec.create("pinned-1", "demo-mlp", tmp_path / "in.npy", tmp_path / "out.npy",
                          version="v2")
    async with running_worker(redis_url, models=TWO_VERSIONS):
        report = await run_job(spec, Endpoints(redis_url))
    assert report.succeeded == 300
    with torch.no_grad():
        v2 = build_mlp(seed=2)(torch.from_numpy(x)).numpy()
        stable = build_mlp()(torch.from_numpy(x)).numpy()
    out = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(out.reshape(v2.shape), v2, rtol=1e-5, atol=1e-6)
    assert not np.allclose(out.reshape(stable.shape), stable)


@pytest.mark.slow
async def test_canary_at_20_percent_splits_10000_requests_within_2_points(
        redis_url: str, registry: RedisModelRegistry) -> None:
    n = 10_000
    x = np.random.default_rng(2).random((n, 10), dtype=np.float32)
    async with running_worker(redis_url, models=TWO_VERSIONS, max_batch_size=128) as worker, \
            AsyncClient(redis_url) as client:
        policy = await canary(registry, 20.0)
        await until(lambda: applied(worker, policy.epoch))
        ids = await client.submit_many("demo-mlp", x)
        results = await client.wait_many(ids, timeout=120)
        keyed = await client.wait_many(await client.submit_many(
            "demo-mlp", x[:50], routing_key="user-7"), timeout=60)
    assert all(r.status == "succeeded" for r in results)
    got = Counter(label(r.model_version) for r in results)
    share = got["v2"] / n * 100
    print(f"canary split over {n}: {share:.2f}% v2 (policy 20%)")
    assert abs(share - 20.0) <= 2.0, got
    assert all(label(r.model_version) == choose(policy, r.request_id) for r in results)
    assert {label(r.model_version) for r in keyed} == {choose(policy, "user-7")}


@pytest.mark.slow
async def test_a_requests_version_survives_sigkill_and_redelivery(
        redis_url: str, registry: RedisModelRegistry) -> None:
    n = 6_000
    x = np.random.default_rng(3).random((n, 10), dtype=np.float32)
    args = ("--claim-idle-ms", "1000", "--max-batch-size", "32")
    victim = WorkerProcess(redis_url, models=TWO_VERSIONS, extra_args=args).start()
    try:
        await asyncio.to_thread(victim.wait_ready)
        policy = await canary(registry, 20.0)
        await until(lambda: beating_with(redis_url, [victim.worker_id], policy.epoch))
        async with AsyncClient(redis_url) as client:
            ids = await client.submit_many("demo-mlp", x)
            await until(lambda: _some_done(client, ids))
            victim.kill()
            done_before = sum(r is not None and r.is_terminal
                              for r in await client._waiter.fetch(ids))
            assert done_before < n, "the kill must land mid-run"
            with WorkerProcess(redis_url, models=TWO_VERSIONS, extra_args=args) as survivor:
                await asyncio.to_thread(survivor.wait_ready)
                results = await client.wait_many(ids, timeout=120)
    finally:
        victim.kill()
    bad = Counter((r.status, r.error.type if r.error else "") for r in results
                  if r.status != "succeeded")
    assert not bad, bad
    assert all(label(r.model_version) == choose(policy, r.request_id) for r in results)


async def _some_done(client: AsyncClient, ids: list[str]) -> bool:
    found = await client._waiter.fetch(ids[:2000])
    return sum(r is not None and r.is_terminal for r in found) > 200


async def test_after_a_rollback_reaches_every_heartbeat_no_request_computes_on_the_canary(
        redis_url: str, registry: RedisModelRegistry) -> None:
    rng = np.random.default_rng(4)
    async with running_worker(redis_url, models=TWO_VERSIONS, worker_id="r-a") as first, \
            running_worker(redis_url, models=TWO_VERSIONS, worker_id="r-b") as second, \
            AsyncClient(redis_url) as client:
        policy = await canary(registry, 50.0)
        await until(lambda: applied(first, policy.epoch))
        await until(lambda: applied(second, policy.epoch))
        before = await client.submit_many("demo-mlp", rng.random((2000, 10), dtype=np.float32))
        rolled_at = time.time()
        rolled = await registry.rollback("demo-mlp", who="test", why="bad canary")
        assert rolled is not None and rolled.canary is None and rolled.epoch > policy.epoch

        await until(lambda: beating_with(redis_url, ["r-a", "r-b"], rolled.epoch))
        beats = await heartbeats(redis_url)
        switched = max(b.policy_applied_at["demo-mlp"] for b in beats
                       if b.worker_id in ("r-a", "r-b"))
        after = await client.submit_many("demo-mlp", rng.random((2000, 10), dtype=np.float32))
        first_run = await client.wait_many(before, timeout=60)
        second_run = await client.wait_many(after, timeout=60)
    assert all(r.status == "succeeded" for r in first_run + second_run)
    assert {label(r.model_version) for r in second_run} == {"default"}
    # whatever computed after the last worker applied the rollback ran on stable,
    # fetched before it or not
    late = [r for r in first_run + second_run if (r.started_at or 0) >= switched]
    assert late and {label(r.model_version) for r in late} == {"default"}
    last_canary = max((r.started_at or 0 for r in first_run
                       if label(r.model_version) == "v2"), default=rolled_at)
    print(f"rollback applied by every worker {switched - rolled_at:.3f}s after the call; "
          f"last canary computation started {last_canary - rolled_at:.3f}s after it")
    assert isinstance(rolled, RolloutPolicy)


@pytest.mark.slow
async def test_pools_the_canary_on_a_worker_that_holds_only_the_canary(fleet: Fleet) -> None:
    """Over both transports: each pool consumes the shared lane and its versions' lanes."""
    n = 3_000
    x = np.random.default_rng(5).random((n, 10), dtype=np.float32)
    reg = open_model_registry(fleet.results, fleet.names)
    with fleet.process(models=("demo-mlp",)) as stable_pool, \
            fleet.process(models=("demo-mlp@v2=demo-mlp:seed=2",)) as canary_pool:
        pools = [stable_pool.worker_id, canary_pool.worker_id]
        try:
            await asyncio.to_thread(stable_pool.wait_ready)
            await asyncio.to_thread(canary_pool.wait_ready)
            policy = await canary(reg, 20.0)
        finally:
            await reg.close()
        await until(lambda: beating_with(fleet.results, pools, policy.epoch, fleet.names),
                    timeout_s=60)
        async with fleet.client() as client:
            results = await client.wait_many(await client.submit_many("demo-mlp", x),
                                             timeout=120)
            pinned = await client.wait_many(await client.submit_many(
                "demo-mlp", x[:100], version="v2"), timeout=60)
        got = Counter(label(r.model_version) for r in results)

        async def counted() -> bool:
            beats = {b.worker_id: b for b in await heartbeats(fleet.results, fleet.names)}
            return sum(beats[w].counters.get("succeeded", 0) for w in pools
                       if w in beats) >= n + 100

        await until(counted)
        beats = {b.worker_id: b for b in await heartbeats(fleet.results, fleet.names)}
    assert all(r.status == "succeeded" for r in results + pinned)  # nothing lost
    assert all(label(r.model_version) == choose(policy, r.request_id) for r in results)
    assert {label(r.model_version) for r in pinned} == {"v2"}
    # each worker computed exactly the requests of the version it holds
    assert beats[stable_pool.worker_id].counters["succeeded"] == got["default"]
    assert beats[canary_pool.worker_id].counters["succeeded"] == got["v2"] + 100
