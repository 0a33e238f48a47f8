"""Redis loses its data, fills up or evicts: workers heal in place, waits end, the fleet drains.

Each disruption lands while a backlog is queued: the requests lost with it end
their waits with RequestLostError (none hang), and everything submitted after
it is served by the same, never restarted, worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import numpy as np
import pytest
import structlog
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.connectors.redis_client import redis_client
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient, OverloadedError, RequestLostError, Result
from batchfleet.producers.admission import AdmissionLimits
from batchfleet.schemas.errors import ResultStoreError, TransportError, UnknownModelError
from batchfleet.schemas.names import LANE_INTERACTIVE, Names
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from tests.support.fleet import running_worker
from tests.support.models import SlowMLP

pytestmark = pytest.mark.e2e
T = TypeVar("T")
NAMES = Names("bf")
GROUP_LOST = "consumer group lost"


def _slow() -> TorchModuleHandler:
    """20 ms per batch of 8: a backlog builds, so a disruption finds requests queued."""
    return TorchModuleHandler("slow", SlowMLP(), input_spec=TensorSpec("float32", (10,)))


def _rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 10), dtype=np.float32)


async def _retrying(call: Callable[[], Awaitable[T]], within_s: float = 20.0) -> T:
    """Retry while Redis is coming back (or the registry is, for a moment)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except (ResultStoreError, TransportError, UnknownModelError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _outcome(client: AsyncClient, ids: Sequence[str]) -> tuple[list[Result], list[str]]:
    """(terminal results, lost IDs) of a wait_many; a generous liveness bound, never a hang."""
    try:
        return await asyncio.wait_for(client.wait_many(ids, timeout=None), 90), []
    except RequestLostError as exc:
        assert len(exc.results) == len(ids)
        got = [r for r in exc.results if r is not None]
        assert {r.request_id for r in got}.isdisjoint(exc.request_ids)
        return got, exc.request_ids


async def _disrupt(how: str, server: EmbeddedRedis, probe: Redis) -> None:
    if how == "restart-empty":
        server.stop()  # no persistence configured: it comes back empty
        server.start()
    elif how == "flushall":
        await probe.flushall()
    else:  # a stream evicted: only the queue goes, records stay pending
        await probe.delete(NAMES.stream("slow", LANE_INTERACTIVE))


@pytest.mark.parametrize("how", ["restart-empty", "flushall", "del-stream"])
async def test_worker_heals_in_place_and_lost_waits_end(how: str, redis_server: EmbeddedRedis
                                                        ) -> None:
    url = redis_server.url
    probe = redis_client(url)
    with structlog.testing.capture_logs() as logs:
        async with running_worker(url, handlers={"slow": _slow()}, max_batch_size=8,
                                  claim_idle_ms=2000) as worker:
            async with AsyncClient(url) as client:
                before = await client.submit_many("slow", _rows(1500, 1))
                await asyncio.sleep(0.5)
                await _disrupt(how, redis_server, probe)
                after = await _retrying(lambda: client.submit_many("slow", _rows(200, 2)))
                done_after, lost_after = await _outcome(client, after)
                done_before, lost_before = await _outcome(client, before)
                registry = await _retrying(client.known_models)
            stopping = worker  # the same in-process worker served everything
    await probe.aclose()
    assert not lost_after and all(r.status == "succeeded" for r in done_after)
    assert len(done_before) + len(lost_before) == len(before)
    assert lost_before, "the disruption found nothing queued: make the backlog longer"
    assert all(r.status == "succeeded" for r in done_before)
    assert "slow" in registry
    warnings = [e for e in logs if str(e.get("event", "")).startswith(GROUP_LOST)]
    assert len(warnings) == 1, warnings  # one line per loss, not one per failed read
    assert stopping.stats.computed >= len(after)
    print(f"{how}: {len(before)} queued before, {len(lost_before)} reported lost, "
          f"{len(done_before)} finished; {len(after)} submitted after, all succeeded")


async def test_registry_and_heartbeat_come_back_after_a_flush(redis_url: str) -> None:
    probe = redis_client(redis_url)
    try:
        async with running_worker(redis_url, handlers={"slow": _slow()}) as worker:
            await probe.flushall()
            key = NAMES.worker_heartbeat(worker.settings.worker_id)
            deadline = time.monotonic() + 10
            while not (await probe.sismember(NAMES.model_registry, "slow")
                       and await probe.exists(key)):
                assert time.monotonic() < deadline, "registry or heartbeat not restored"
                await asyncio.sleep(0.1)
    finally:
        await probe.aclose()


@pytest.mark.slow
async def test_allkeys_lru_evictions_end_every_wait(redis_url: str) -> None:
    """A real eviction run: whatever Redis evicts (records, streams, the registry), every
    wait ends (result or RequestLostError) and the worker serves new work afterwards."""
    probe = redis_client(redis_url)
    await probe.config_set("maxmemory-policy", "allkeys-lru")
    await probe.config_set("maxmemory", str(int(await _used(probe)) + 3 * 1024 * 1024))
    try:
        # Admission off, so Redis really reaches maxmemory and evicts.
        async with running_worker(redis_url, handlers={"slow": _slow()}, max_batch_size=8,
                                  claim_idle_ms=2000), \
                AsyncClient(redis_url, admission=AdmissionLimits(max_memory=0),
                            check_model=False) as client:
            ids: list[str] = []
            for seed in range(6):
                ids += await client.submit_many("slow", _rows(1000, seed))
            evicted = int((await probe.info("stats"))["evicted_keys"])
            done, lost = await _outcome(client, ids)
            await probe.config_set("maxmemory", "0")
            fresh = await client.submit_many("slow", _rows(100, 99))
            fresh_done, fresh_lost = await _outcome(client, fresh)
    finally:
        await probe.aclose()
    assert evicted > 0
    assert len(done) + len(lost) == len(ids) and lost
    assert not fresh_lost and all(r.status == "succeeded" for r in fresh_done)
    print(f"allkeys-lru: {len(ids)} submitted, {evicted} keys evicted, {len(done)} finished, "
          f"{len(lost)} reported lost; 100 fresh requests all succeeded")


async def _used(probe: Redis) -> int:
    return int((await probe.info("memory"))["used_memory"])


@pytest.mark.slow
async def test_noeviction_at_maxmemory_refuses_at_the_mark_and_drains(redis_url: str) -> None:
    """A stopped worker, 15,000 submits into a small noeviction Redis: producers are refused
    at the mark (never an OOM), and once the worker runs again everything accepted ends.
    Then Redis is filled to the brim behind the fleet's back: result writes fail with OOM,
    the worker holds what it has, and resumes by itself once memory is freed."""
    probe = redis_client(redis_url)
    worker = WorkerProcess(redis_url, models=("demo-mlp",),
                           extra_args=("--max-batch-size", "64", "--breaker-cooldown-s", "0.5"))
    try:
        worker.start()
        await asyncio.to_thread(worker.wait_ready)
        assert worker.proc is not None
        await probe.config_set("maxmemory", str(await _used(probe) + 8 * 1024 * 1024))
        limit = int((await probe.info("memory"))["maxmemory"])
        os.kill(worker.proc.pid, signal.SIGSTOP)
        accepted: list[str] = []
        refused = 0
        async with AsyncClient(redis_url) as client:
            for seed in range(30):
                try:
                    accepted += await client.submit_many("demo-mlp", _rows(500, seed))
                except OverloadedError as exc:
                    accepted += exc.accepted
                    refused += 500 - len(exc.accepted)
                    await asyncio.sleep(0.05)
            peak = await _used(probe)
            # Fill the rest: from here on every write the fleet tries fails with OOM.
            filler = 0
            while True:
                try:
                    await probe.set(f"filler:{filler}", b"x" * 65536)
                    filler += 1
                except OutOfMemoryError:  # the refusal ends the filling
                    break
            os.kill(worker.proc.pid, signal.SIGCONT)
            await asyncio.sleep(3.0)
            assert worker.alive, worker.log_tail()
            stalled = "maxmemory" in worker.log_path.read_text()  # its writes were refused
            await probe.delete(*[f"filler:{i}" for i in range(filler)])
            results, lost = await _outcome(client, accepted)
    finally:
        if worker.proc is not None and worker.alive:
            os.kill(worker.proc.pid, signal.SIGCONT)
        worker.kill()
        await probe.aclose()
    assert refused > 0 and accepted, (refused, len(accepted))
    assert stalled
    assert peak < limit, (peak, limit)
    assert not lost and len(results) == len(accepted)
    assert all(r.status == "succeeded" for r in results)
    print(f"noeviction: {len(accepted)} accepted, {refused} refused at the mark, peak "
          f"{peak / limit:.0%} of maxmemory; all accepted succeeded after a full-Redis stall")


async def test_gateway_refuses_with_503_past_the_mark_and_forgets_lost_models(
        redis_url: str) -> None:
    """The gateway maps the admission refusal to 503 + Retry-After, reports an eviction
    policy that can drop queues, and stops answering 202 once a model's registry is gone."""
    import httpx

    from tests.e2e.test_gateway import AUTH, settings
    from tests.support.gateway_main import live_gateway

    probe = redis_client(redis_url)
    await probe.sadd(Names("gwt").model_registry, "demo-mlp")
    body = {"inputs": [0.5] * 10}
    try:
        with live_gateway(settings(redis_url, model_list_ttl_s=0.5)) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                url = "/v1/models/demo-mlp/requests"
                assert (await http.post(url, json=body, headers=AUTH)).status_code == 202
                await probe.config_set("maxmemory", str(await _used(probe) + 1024))
                refused = await http.post(url, json=body, headers=AUTH)
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["type"] == "overloaded"
                assert refused.json()["error"]["retryable"] is True
                assert int(refused.headers["Retry-After"]) >= 1
                await probe.config_set("maxmemory", "0")
                await probe.config_set("maxmemory-policy", "allkeys-lru")
                ready = (await http.get("/readyz")).json()
                assert ready["eviction_policy"] == "allkeys-lru"
                assert ready["eviction_policy_safe"] is False
                await probe.config_set("maxmemory-policy", "noeviction")
                await probe.delete(Names("gwt").model_registry)  # no worker serves it now
                await asyncio.sleep(1.0)  # past the model list's TTL
                gone = await http.post(url, json=body, headers=AUTH)
                assert gone.status_code == 404, gone.text
    finally:
        await probe.aclose()


async def test_worker_readiness_reports_an_unsafe_eviction_policy(redis_url: str) -> None:
    probe = redis_client(redis_url)
    try:
        async with running_worker(redis_url, handlers={"slow": _slow()}) as worker:
            _, safe = await worker.readiness()
            assert safe["eviction_policy"] == "noeviction" and safe["eviction_policy_safe"]
            await probe.config_set("maxmemory-policy", "allkeys-lru")
            ready, unsafe = await worker.readiness()
            assert unsafe["eviction_policy_safe"] is False
            assert ready  # reported, not gated on: fixing Redis is the operator's job
    finally:
        await probe.aclose()
