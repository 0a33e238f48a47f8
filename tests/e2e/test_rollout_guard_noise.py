"""The latency guard is judged on evidence, with real Redis and real worker processes.

* No rollback on noise: a canary identical to stable (the same demo-mlp, 50% of traffic)
  with CPU hogs beside its worker, 5,000 requests in small batches: slow batches happen
  to both versions, and the guard, which judged the latency over and over past its
  minimum counts, never rolls the canary back.
* A canary truly three times slower on every batch (90 ms against 30 ms), served by a
  worker pool of its own, IS rolled back by the guard, with the test, its numbers and
  both sample sizes in the history's ``why``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.rollout_stats import RedisRolloutStats, RoleStats, bound_of
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.workers.rollout_verdicts import MIN_BATCHES
from tests.e2e.test_rollout_routing import heartbeats

pytestmark = pytest.mark.e2e

#: Small batches, so 5,000 requests make hundreds of batches: evidence for the p99.
BATCHING = ("--max-batch-size", "8", "--max-wait-ms", "2")


@contextmanager
def cpu_hogs(n: int = 2) -> Iterator[None]:
    """``n`` busy loops (one per core of this box) beside the worker, for the test's span."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


async def _stats(url: str, model: str, stable: str, canary: str
                 ) -> tuple[RoleStats, RoleStats, int | None]:
    client = redis_client(url)
    try:
        found = await RedisRolloutStats(client, Names()).read_versions(model, (stable, canary))
    finally:
        await client.aclose()
    return found[stable].role("stable"), found[canary].role("canary"), found[canary].epoch


def _guard_lines(*workers: WorkerProcess) -> list[str]:
    """The rollbacks each worker logged (one JSON object a line)."""
    out = []
    for w in workers:
        for line in w.log_path.read_text(errors="replace").splitlines():
            if "rollout guard rolled back" in line:
                out.append(json.loads(line).get("why", line))
    return out


async def _set_canary(url: str, model: str, canary: str, percent: float) -> RolloutPolicy:
    registry = open_model_registry(url, Names())
    try:
        return await registry.set_policy(model, stable="default", canary=canary,
                                         percent=percent, guard=GuardThresholds(),
                                         who="test", why="guard test")
    finally:
        await registry.close()


async def _policy(url: str, model: str) -> tuple[RolloutPolicy, list[tuple[str, str, str]]]:
    registry = open_model_registry(url, Names())
    try:
        history = await registry.history(model, 5)
        return (await registry.get_policy(model),
                [(h.who, h.action, h.why) for h in history])
    finally:
        await registry.close()


async def _applied(url: str, model: str, epoch: int, workers: list[str],
                   timeout_s: float = 60.0) -> None:
    """Every worker's heartbeat reports the epoch (liveness bound only)."""
    deadline = time.monotonic() + timeout_s
    while True:
        beats = {b.worker_id: b for b in await heartbeats(url)}
        if all(w in beats and beats[w].policy_epochs.get(model, -1) >= epoch for w in workers):
            return
        assert time.monotonic() < deadline, "workers never applied the policy"
        await asyncio.sleep(0.1)


async def test_an_identical_canary_beside_cpu_hogs_is_not_rolled_back(redis_url: str) -> None:
    n, chunk = 5000, 250
    x = np.random.default_rng(11).random((n, 10), dtype=np.float32)
    worker = WorkerProcess(redis_url, models=("demo-mlp", "demo-mlp@v2=demo-mlp"),
                           extra_args=BATCHING)
    with worker:
        await asyncio.to_thread(worker.wait_ready)
        policy = await _set_canary(redis_url, "demo-mlp", "v2", 50.0)
        await _applied(redis_url, "demo-mlp", policy.epoch, [worker.worker_id])
        with cpu_hogs():
            async with AsyncClient(redis_url) as client:
                for i in range(0, n, chunk):  # a stream of traffic: many guard rounds
                    ids = await client.submit_many("demo-mlp", list(x[i:i + chunk]))
                    results = await client.wait_many(ids, timeout=120)
                    assert all(r.status == "succeeded" for r in results)
                    await asyncio.sleep(0.3)
            await asyncio.sleep(5.0)  # the last flush (2 s) and two more guard rounds
        stable, canary, epoch = await _stats(redis_url, "demo-mlp", "default", "v2")
        after, history = await _policy(redis_url, "demo-mlp")
    # the guard had its evidence: both past the latency minimums under this policy
    assert epoch == policy.epoch
    assert min(stable.latency.total, canary.latency.total) >= MIN_BATCHES, (stable, canary)
    assert canary.requests >= policy.guard.min_window and stable.requests + canary.requests == n
    # ... and did not roll back
    assert (after.epoch, after.canary) == (policy.epoch, "v2"), history
    assert _guard_lines(worker) == []
    c99, s99 = canary.latency.percentile(0.99), stable.latency.percentile(0.99)
    slowest = max((bound_of(b) for b in canary.latency.counts), default=0.0)
    print(f"noise: canary p99 {c99} ms over {canary.latency.total} batches, stable p99 "
          f"{s99} ms over {stable.latency.total} batches; the canary's slowest batch "
          f"{slowest} ms ({slowest / (s99 or 1):.1f}x stable's p99: a 20-batch p99 holding "
          "it is its maximum)")


async def test_a_canary_three_times_slower_on_its_own_pool_is_rolled_back(
        redis_url: str) -> None:
    model = "paced"
    x = np.random.default_rng(12).random((200, 10), dtype=np.float32)
    stable_pool = WorkerProcess(redis_url, models=(f"{model}=tests.support.models:paced_mlp",),
                                extra_args=BATCHING)
    canary_pool = WorkerProcess(redis_url, models=(
        f"{model}@slow=tests.support.models:paced_mlp_3x",), extra_args=BATCHING)
    with stable_pool, canary_pool:
        await asyncio.to_thread(stable_pool.wait_ready)
        await asyncio.to_thread(canary_pool.wait_ready)
        policy = await _set_canary(redis_url, model, "slow", 50.0)
        await _applied(redis_url, model, policy.epoch,
                       [stable_pool.worker_id, canary_pool.worker_id])
        deadline = time.monotonic() + 120.0
        async with AsyncClient(redis_url) as client:
            while (after := (await _policy(redis_url, model))[0]).canary is not None:
                if time.monotonic() > deadline:
                    found = await _stats(redis_url, model, "default", "slow")
                    raise AssertionError(f"the guard never rolled back: {after} {found}\n"
                                         f"{stable_pool.log_tail()}\n{canary_pool.log_tail()}")
                ids = await client.submit_many(model, list(x))  # traffic until it acts
                await client.wait_many(ids, timeout=120)
        await asyncio.sleep(4.5)  # two more guard rounds on each worker: nothing more
        _, history = await _policy(redis_url, model)
        logged = _guard_lines(stable_pool, canary_pool)
    assert (after.stable, after.canary, after.epoch) == ("default", None, policy.epoch + 1)
    who, action, why = history[0]
    assert (who, action) == ("guard", "rollback")
    for part in ("canary p99 compute ", "x > 2x) over ", " canary batches (", " stable batches (",
                 "two-proportion z = ", "(one-sided alpha 0.001)", "at 2 consecutive evaluations"):
        assert part in why, why
    canary_batches = int(why.split(" over ", 1)[1].split()[0])
    stable_batches = int(why.split(" and ", 1)[1].split()[0])
    assert min(canary_batches, stable_batches) >= MIN_BATCHES, why
    assert logged == [why]  # one worker made the one rollback, whichever pool it is in
    print(f"slow canary: {why}")
