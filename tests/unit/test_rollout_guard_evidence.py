"""The guard middleware over output evidence, on a real worker on ``memory://``: without a
source the output checks are skipped (said once); with one, the source is asked for the
canary and stable since the policy epoch began, and a canary whose NaN rate is past
``--guard-nan-points`` is rolled back by the guard with the test's numbers."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from batchfleet import AsyncClient
from batchfleet.connectors import open_control_plane
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.schemas.registry import GuardThresholds
from batchfleet.workers.middleware.rollout_guard import RolloutGuard
from batchfleet.workers.middleware.rollout_stats import VersionStats
from batchfleet.workers.rollout_evidence import OutputEvidence
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

pytestmark = pytest.mark.unit


class HandMade:
    """An ``EvidenceSource`` answering fixed evidence and keeping what it was asked."""

    def __init__(self, canary: OutputEvidence, stable: OutputEvidence) -> None:
        self.answer = (canary, stable)
        self.asked: list[tuple[str, str, str, float]] = []

    async def output_evidence(self, model: str, canary: str, stable: str, since_unix_s: float
                              ) -> tuple[OutputEvidence, OutputEvidence] | None:
        self.asked.append((model, canary, stable, since_unix_s))
        return self.answer


async def test_nan_evidence_rolls_the_canary_back_and_none_is_skipped() -> None:
    url = f"memory://guard-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False, device="cpu",
                                       output_stats=False,  # no evidence source
                                       models=("demo-mlp", "demo-mlp@v2=demo-mlp:seed=2"))
    worker = Worker(settings)
    plane = open_control_plane(url)
    client = AsyncClient(url, check_model=False)
    running = asyncio.create_task(worker.async_run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 60)
        guard = worker.find(RolloutGuard)
        set_to = await plane.rollouts.set("demo-mlp", stable="default", canary="v2",
                                          percent=50, guard=GuardThresholds(nan_points=1.0),
                                          who="test", why="nan check")
        assert worker.context is not None
        await guard._policies.refresh(worker.context, force=True)
        rows = np.random.default_rng(0).random((60, 10), dtype=np.float32)
        await client.wait_many(await client.submit_many("demo-mlp", list(rows)), timeout=30)
        await worker.find(VersionStats).flush()

        await guard.check()  # no source: skipped, said once, nothing rolled back
        assert guard._said_no_evidence and guard.rollbacks == []
        assert (await plane.models.get_policy("demo-mlp")).canary == "v2"

        source = HandMade(OutputEvidence(5000, 250, None, 5000, 250),
                          OutputEvidence(20_000, 0, None, 20_000, 0))
        guard._evidence = source
        await guard.check()
        after = await plane.models.get_policy("demo-mlp")
        history = await plane.models.history("demo-mlp", 2)
    finally:
        await client.close()
        worker.request_stop()
        await running
        await plane.close()
        reset_memory(url)
    assert (after.canary, after.epoch) == (None, set_to.epoch + 1)
    assert source.asked[0][:3] == ("demo-mlp", "v2", "default")
    assert source.asked[0][3] == history[1].at  # since the epoch's own history entry
    assert (history[0].who, history[0].action) == ("guard", "rollback")
    assert history[0].why.startswith(
        "canary NaN rate 5.0% (250 of 5000) vs stable 0.0% (0 of 20000) requests with a NaN "
        "output (output values 5.0% (250 of 5000) vs 0.0% (0 of 20000)): excess 5.0 > 1 points")
    assert [r[2] for r in guard.rollbacks] == [history[0].why]
