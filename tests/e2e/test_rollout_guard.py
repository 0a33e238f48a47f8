"""The automatic rollback guard against a real Redis and two real workers: a canary that
fails a deterministic 20% of its requests is rolled back by itself once its window is
full, exactly once however many workers judge it, and the history records why."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from batchfleet.producers import AsyncClient
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.workers import Worker
from batchfleet.workers.middleware.rollout_guard import RolloutGuard
from tests.support.fleet import running_worker
from tests.support.models import FLAKY
from tests.support.seams import model_registry_for

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"
WINDOW = 100
REQUESTS = 500


async def _rolled_back(worker: Worker, epoch: int, timeout_s: float = 60.0) -> RolloutPolicy:
    """The policy once the canary is gone (liveness bound only)."""
    registry = model_registry_for(worker.store)
    deadline = time.monotonic() + timeout_s
    while True:
        policy = await registry.get_policy(MODEL)
        if policy.epoch > epoch and policy.canary is None:
            return policy
        assert time.monotonic() < deadline, f"the guard never rolled back: {policy}"
        await asyncio.sleep(0.2)


async def test_a_canary_failing_one_in_five_is_rolled_back_once_with_why(
        redis_url: str) -> None:
    models = (MODEL, f"{MODEL}@flaky=tests.support.models:flaky_canary")
    async with running_worker(redis_url, models=models, worker_id="w1", max_wait_ms=5,
                              max_attempts=5, retry_base_s=0.05) as w1, \
            running_worker(redis_url, models=models, worker_id="w2", max_wait_ms=5,
                           max_attempts=5, retry_base_s=0.05) as w2, \
            AsyncClient(redis_url) as client:
        guard = GuardThresholds(error_points=5.0, p99_ratio=1000.0, min_window=WINDOW)
        set_to = await model_registry_for(w1.store).set_policy(
            MODEL, stable="default", canary="flaky", percent=50, guard=guard, who="test",
            why="try flaky")
        rows = np.random.default_rng(3).standard_normal((REQUESTS, 10)).astype(np.float32)
        rows[:, 1] = np.where(np.arange(REQUESTS) % 5 == 0, FLAKY, 1.0)  # one in five fails
        for worker in (w1, w2):  # both apply the canary before any request is fetched
            await worker.find(RolloutGuard)._policies.refresh(worker.context, force=True)
        ids = await client.submit_many(MODEL, list(rows))

        after = await _rolled_back(w1, set_to.epoch)
        assert (after.stable, after.canary, after.epoch) == ("default", None, set_to.epoch + 1)
        history = await model_registry_for(w1.store).history(MODEL)
        assert [(h.who, h.action) for h in history[:2]] == [("guard", "rollback"),
                                                             ("test", "set")]
        why = history[0].why
        # the test, its numbers and both sample sizes
        assert why.startswith("canary error rate ") and " vs stable 0.0% (0 of " in why, why
        assert "two-proportion z = " in why and "(one-sided alpha 0.001)" in why, why
        judged = int(why.split("% (", 1)[1].split(" of ")[1].split(")")[0])
        assert judged >= WINDOW
        rate = float(why.removeprefix("canary error rate ").split("%")[0])
        assert rate >= 5.0, why
        print(f"error guard: {why}")

        # Exactly one rollback, by one worker, however many judged it.
        results = await client.wait_many(ids, timeout=90)
        await asyncio.sleep(4.5)  # two more guard rounds on each worker: nothing more happens
        made = [r for w in (w1, w2) for r in w.find(RolloutGuard).rollbacks]
        assert len(made) == 1 and made[0][1] == after.epoch
        counted = sum(w.metrics.auto_rollbacks.labels(MODEL)._value.get() for w in (w1, w2))
        assert counted == 1
        assert [h.who for h in await model_registry_for(w1.store).history(MODEL)].count(
            "guard") == 1

        # Nothing lost: every request has one terminal result; only flaky inputs failed,
        # and whatever succeeded was computed by a version of demo-mlp.
        flaky = rows[:, 1] == FLAKY
        for row_flaky, result in zip(flaky, results, strict=True):
            assert result.status in ("succeeded", "failed")
            assert result.status == "succeeded" or row_flaky
        assert sum(r.status == "succeeded" for r in results) >= (~flaky).sum()
