"""Pipelines end to end on a real Redis and real workers: each step a queue hop on its
model's lane, the caller's request ID carrying the final result with ``steps``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.connectors.redis_plane import open_redis_control_plane
from batchfleet.schemas.pipeline import from_steps
from batchfleet.schemas.registry import Declaration
from batchfleet.workers.models.builtin import build_mlp
from tests.support.fleet import running_worker
from tests.support.pipeline_models import build_mix

pytestmark = pytest.mark.e2e
MODELS = ("mix=tests.support.pipeline_models:mix", "demo-mlp")


async def declare(url: str, ns: str, name: str, steps: str) -> None:
    plane = open_redis_control_plane(url, namespace=ns)
    try:
        for model in {s.partition("@")[0] for s in steps.split(",")}:
            await plane.models.declare(model, Declaration(0.0))
        await plane.pipelines.declare(from_steps(name, steps))
    finally:
        await plane.close()


def composed(rows: np.ndarray) -> np.ndarray:
    mix, mlp = build_mix(), build_mlp()
    with torch.no_grad():
        return mlp(mix(mix(torch.from_numpy(rows)))).numpy()  # type: ignore[no-any-return]


async def test_three_step_chain_equals_local_composition(redis_url: str) -> None:
    await declare(redis_url, "p3", "chain", "mix,mix,demo-mlp")
    rows = np.random.default_rng(29).random((2000, 10), dtype=np.float32)
    async with (running_worker(redis_url, models=MODELS, namespace="p3", max_wait_ms=5),
                AsyncClient(redis_url, namespace="p3") as client):
        ids = await client.submit_many("chain", list(rows))
        results = await client.wait_many(ids, timeout=180)
    assert len(set(ids)) == 2000
    assert [r.status for r in results] == ["succeeded"] * 2000
    got = np.stack([np.asarray(r.outputs) for r in results])
    np.testing.assert_allclose(got, composed(rows), rtol=1e-5, atol=1e-6)
    for rid, r in zip(ids, results, strict=True):
        assert r.request_id == rid and r.model == "chain"
        assert [s["step"] for s in r.steps or []] == ["mix", "mix-2", "demo-mlp"]
        assert [s["model"] for s in r.steps or []] == ["mix", "mix", "demo-mlp"]
        assert all(s["attempts"] == 1 and s["model_version"] for s in r.steps or [])
