"""The rollout guard judging a canary's outputs through the output statistics, against a
real Redis and a real worker: a canary whose answers are shifted by 0.3 is rolled back by
``--guard-psi``, one that answers NaN for 5% of requests by ``--guard-nan-points``, and
the history's ``why`` names the test, its numbers and the sample sizes."""

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
from tests.support.output_models import NAN_MARK
from tests.support.seams import model_registry_for

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"
REQUESTS = 6000


async def _rolled_back(worker: Worker, epoch: int, timeout_s: float = 60.0) -> RolloutPolicy:
    registry = model_registry_for(worker.store)
    deadline = time.monotonic() + timeout_s
    while True:
        policy = await registry.get_policy(MODEL)
        if policy.epoch > epoch and policy.canary is None:
            return policy
        assert time.monotonic() < deadline, f"the guard never rolled back: {policy}"
        await asyncio.sleep(0.2)


async def _canary_rolled_back(redis_url: str, canary: str, guard: GuardThresholds,
                              rows: np.ndarray) -> str:
    """Serve stable and ``canary`` at 50%, send ``rows``; the guard's ``why``."""
    models = (MODEL, f"{MODEL}@{canary}=tests.support.output_models:{canary}_canary")
    async with running_worker(redis_url, models=models, worker_id="g1", max_wait_ms=5) as w, \
            AsyncClient(redis_url) as client:
        set_to = await model_registry_for(w.store).set_policy(
            MODEL, stable="default", canary=canary, percent=50, guard=guard, who="test",
            why=f"try {canary}")
        await w.find(RolloutGuard)._policies.refresh(w.context, force=True)
        ids = await client.submit_many(MODEL, list(rows))
        after = await _rolled_back(w, set_to.epoch)
        assert (after.stable, after.canary) == ("default", None)
        history = await model_registry_for(w.store).history(MODEL)
        assert [(h.who, h.action) for h in history[:2]] == [("guard", "rollback"),
                                                             ("test", "set")]
        done = await client.wait_many(ids, timeout=120)
        assert all(r.status == "succeeded" for r in done)  # wrong answers are not errors
        return history[0].why


async def test_a_canary_shifted_by_0_3_is_rolled_back_by_the_psi_guard(redis_url: str) -> None:
    rows = np.random.default_rng(21).standard_normal((REQUESTS, 10)).astype(np.float32)
    why = await _canary_rolled_back(
        redis_url, "shifted", GuardThresholds(p99_ratio=1000.0, psi=0.25), rows)
    assert why.startswith("canary output PSI "), why
    psi = float(why.removeprefix("canary output PSI ").split()[0])
    assert psi > 0.25, why


async def test_a_canary_answering_nan_for_5_percent_is_rolled_back_by_the_nan_guard(
        redis_url: str) -> None:
    rows = np.random.default_rng(22).standard_normal((REQUESTS, 10)).astype(np.float32)
    rows[::20, 1] = NAN_MARK  # one request in twenty
    why = await _canary_rolled_back(
        redis_url, "nan", GuardThresholds(p99_ratio=1000.0, nan_points=2.0), rows)
    assert why.startswith("canary NaN rate "), why
    assert " vs stable 0.0" in why, why
