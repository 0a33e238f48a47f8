"""Shadow runs against a real Redis and a real worker: callers see only stable outputs,
every shadowed request is counted once (compared, skipped or error), a shadow that is
the same model differs by exactly zero, and ``rollout report --json`` prints it all."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors import open_result_store
from batchfleet.connectors.model_registry import model_registry_for
from batchfleet.connectors.rollout_stats import ShadowReport, rollout_stats_for
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from batchfleet.workers.middleware.rollout_stats import VersionStats
from batchfleet.workers.middleware.shadow import Shadow
from batchfleet.workers.models.builtin import build_mlp
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"
WAVES, PER_WAVE = 6, 40


async def _report_settles(redis_url: str, shadowed: int, timeout_s: float = 30.0
                          ) -> ShadowReport:
    """The flushed report once every shadowed request is counted (liveness bound only)."""
    store = open_result_store(redis_url, Names())
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            found = await rollout_stats_for(store).read_comparisons(MODEL)
            if found is not None and found.compared + found.skipped + found.errors >= shadowed:
                return found
            assert time.monotonic() < deadline, f"comparisons never reached {shadowed}: {found}"
            await asyncio.sleep(0.2)
    finally:
        await store.close()


async def test_shadow_of_the_same_model_is_compared_and_never_returned(
        redis_url: str, tmp_path: Path) -> None:
    models = (MODEL, f"{MODEL}@v1={MODEL}")
    async with running_worker(redis_url, models=models, max_wait_ms=5) as worker, \
            AsyncClient(redis_url) as client:
        policy = await model_registry_for(worker.store).set_policy(
            MODEL, stable="default", shadow="v1", who="test", why="shadow v1")
        cache = worker.find(VersionStats).policies
        await cache.refresh(worker, force=True)
        assert cache.epoch(MODEL) == policy.epoch
        rng = np.random.default_rng(7)
        rows = rng.standard_normal((WAVES * PER_WAVE, 10)).astype(np.float32)
        results = []
        for wave in range(WAVES):  # waves with a pause: some batches find compute idle
            chunk = rows[wave * PER_WAVE:(wave + 1) * PER_WAVE]
            ids = await client.submit_many(MODEL, list(chunk))
            results += await client.wait_many(ids, timeout=60)

        # Callers see stable's answers only: computed by "default", equal to demo-mlp.
        expected = build_mlp()(torch.from_numpy(rows)).detach().numpy()
        assert [r.status for r in results] == ["succeeded"] * len(rows)
        assert {r.model_version.split("/")[0] for r in results} == {"default"}
        np.testing.assert_allclose(np.stack([r.outputs for r in results]), expected,
                                   rtol=1e-5, atol=1e-6)

        found = await _report_settles(redis_url, len(rows))
        # Every shadowed request counted exactly once; the same model differs by zero.
        assert (found.compared + found.skipped, found.errors) == (len(rows), 0)
        assert found.compared > 0
        assert (found.max_abs, found.sum_abs) == (0.0, 0.0)
        assert found.agree == found.compared
        assert (found.stable, found.shadow, found.epoch) == ("default", "v1", policy.epoch)
        assert found.latency["shadow"].total > 0
        assert worker.find(Shadow) is not None
        # Prometheus, labelled by version and role, agrees with the fleet record.
        m = worker.metrics
        assert m.shadow_requests.labels(MODEL, "compared")._value.get() == found.compared
        assert m.version_requests.labels(MODEL, "default", "stable", "ok")._value.get() \
            == len(rows)
        assert m.version_requests.labels(MODEL, "v1", "shadow", "ok")._value.get() \
            == found.compared

        # the CLI runs its own event loop: off this one, in a thread
        out = await asyncio.to_thread(CliRunner().invoke, app, [
            "rollout", "report", MODEL, "--broker", redis_url, "--json",
            "--plot", str(tmp_path / "shadow.png")])
        assert out.exit_code == 0, out.output
        body = json.loads(out.stdout)
        assert body["compared"] + body["skipped"] == len(rows)
        assert (body["max_abs_diff"], body["mean_abs_diff"]) == (0.0, 0.0)
        assert body["agreement_rate"] == 1.0
        assert body["latency_ms"]["stable"]["p99"] is not None
        assert (tmp_path / "shadow.png").stat().st_size > 0


def test_rollout_report_without_a_shadow_is_a_one_line_error(redis_url: str) -> None:
    out = CliRunner().invoke(app, ["rollout", "report", "nobody", "--broker", redis_url])
    assert out.exit_code == 1
    assert "no shadow comparisons" in out.output
