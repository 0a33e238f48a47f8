"""Shadow runs against a real Redis and a real worker: callers see only stable outputs,
every shadowed request is counted once (compared, skipped or error), a shadow that is
the same model differs by exactly zero, ``rollout report --json`` prints it all, and a
shadow that waits 0.5 s per batch delays no stable batch (a worker process, /metrics)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors.output_report import read_rows
from batchfleet.connectors.rollout_stats import ShadowReport
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from batchfleet.workers.middleware.output_stats import OutputStats
from batchfleet.workers.middleware.rollout_stats import VersionStats
from batchfleet.workers.middleware.shadow import Shadow
from batchfleet.workers.models.builtin import build_mlp
from tests.support.fleet import running_worker
from tests.support.seams import model_registry_for, open_result_store, rollout_stats_for

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
        await cache.refresh(worker.context, force=True)
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
        # The shadow's answers are in its output statistics, judged against stable's.
        outputs = worker.find(OutputStats)
        await outputs.flush()
        rows_by = {r.version: r for r in await read_rows(worker.context.plane, MODEL, 600)}
        shadow_row = rows_by["v1"]
        assert (shadow_row.role, shadow_row.outputs.reference) == ("shadow", "stable")
        assert shadow_row.outputs.summary.rows == found.compared

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _counters(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The worker's /metrics: (sample name, sorted labels) -> value."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}


def _total(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return sum(v for (n, ls), v in found.items()
               if n == name and set(labels.items()) <= set(ls))


async def test_a_shadow_that_waits_half_a_second_delays_no_stable_batch(redis_url: str) -> None:
    """Sequential requests (a closed loop) while the shadow version sleeps 0.5 s per batch:
    stable batches run beside shadow forwards, none waits for one to end, and batches over
    the shadow's time budget (or finding its thread busy) are skipped and counted."""
    port = _free_port()
    models = (MODEL, f"{MODEL}@slow=tests.support.models:slow_shadow")
    args = ("--metrics-port", str(port), "--max-wait-ms", "2", "--shadow-budget",
            f"{MODEL}=0.5")
    with WorkerProcess(redis_url, models=models, extra_args=args) as worker:
        await asyncio.to_thread(worker.wait_ready)
        store = open_result_store(redis_url, Names())
        try:
            await model_registry_for(store).set_policy(
                MODEL, stable="default", shadow="slow", who="test", why="a slow shadow")
        finally:
            await store.close()
        rows = np.random.default_rng(5).standard_normal((1000, 10)).astype(np.float32)
        sent, found = 0, _counters(port)
        deadline = time.monotonic() + 60  # liveness only: ~2 s once the policy is seen
        async with AsyncClient(redis_url) as client:
            while (_total(found, "batchfleet_shadow_requests_total", outcome="compared") < 2
                   or _total(found, "batchfleet_stable_batches_beside_shadow_total") < 2):
                assert time.monotonic() < deadline, f"shadow never compared: {found}"
                result = await client.wait(await client.submit(MODEL, rows[sent % 1000]), 30)
                assert (result.status, result.model_version.split("/")[0]) == (
                    "succeeded", "default")
                sent += 1
                if sent % 10 == 0:
                    found = await asyncio.to_thread(_counters, port)
        found = await asyncio.to_thread(_counters, port)

    # Stable batches were handed to compute while a shadow forward ran, and not one of
    # them waited for it to end: the shadow holds no compute slot.
    assert _total(found, "batchfleet_stable_batches_beside_shadow_total") >= 2
    assert _total(found, "batchfleet_stable_batches_delayed_by_shadow_total") == 0
    # One shadow batch at a time, at most half the wall clock: the rest is skipped, counted.
    skipped = _total(found, "batchfleet_shadow_batches_skipped_total", model=MODEL)
    assert _total(found, "batchfleet_shadow_batches_skipped_total", reason="budget") > 0
    assert skipped == _total(found, "batchfleet_shadow_requests_total", outcome="skipped")
    assert _total(found, "batchfleet_shadow_requests_total", outcome="error") == 0
    offered = _total(found, "batchfleet_shadow_requests_total")
    assert 2 <= offered <= sent


async def test_a_shadow_that_hangs_is_abandoned_at_its_limit_and_shadowing_goes_on(
        redis_url: str) -> None:
    """A shadow forward past its lane's compute limit (0.5 s here) is skipped as
    ``stalled`` and its thread abandoned; the next copies run on a fresh thread (without
    the bound every later copy was skipped ``busy`` until a restart)."""
    from batchfleet.workers.per_model import PerModel
    from tests.support.models import HANG

    models = (MODEL, f"{MODEL}@hang=tests.support.models:hang_model")
    limits = PerModel(None, (((MODEL, "hang"), 0.5),))
    async with running_worker(redis_url, models=models, max_wait_ms=5,
                              compute_timeout_s=limits, shadow_budget=PerModel(None)
                              ) as worker, AsyncClient(redis_url) as client:
        await model_registry_for(worker.store).set_policy(
            MODEL, stable="default", shadow="hang", who="test", why="shadow a hang")
        await worker.find(VersionStats).policies.refresh(worker, force=True)
        m = worker.metrics
        stalled = m.shadow_skipped.labels(MODEL, "stalled")
        compared = m.shadow_requests.labels(MODEL, "compared")
        hangs = np.full((1, 10), HANG, np.float32)
        [r] = await client.wait_many(await client.submit_many(MODEL, list(hangs)), 30)
        assert r.status == "succeeded"  # stable answers; the shadow hangs on its copy
        deadline = time.monotonic() + 30  # liveness bounds only
        while stalled._value.get() < 1:
            assert time.monotonic() < deadline, "the hanging shadow was never abandoned"
            await asyncio.sleep(0.1)
        rows = np.zeros((1, 10), np.float32)
        while compared._value.get() < 1:
            assert time.monotonic() < deadline, "shadowing never resumed after the hang"
            await client.wait_many(await client.submit_many(MODEL, list(rows)), 30)
            await asyncio.sleep(0.1)
        assert stalled._value.get() == 1
        assert m.shadow_skipped.labels(MODEL, "busy")._value.get() == 0
