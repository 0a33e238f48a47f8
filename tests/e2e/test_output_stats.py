"""Output and input statistics against a real Redis and two real workers: merged counts
are exactly the sum of what each worker counted, a version against its own baseline on
the same inputs reads PSI < 0.02, and inputs moved from N(0,1) to N(1,1) show input drift
in ``models outputs --inputs`` (the CLI, as a user runs it)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors.output_report import freeze_baseline, read_rows
from batchfleet.producers import AsyncClient
from batchfleet.workers import Worker
from batchfleet.workers.middleware.output_stats import OutputStats
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"
N = 6000


async def _phase(client: AsyncClient, workers: tuple[Worker, Worker], mean: float,
                 seed: int) -> float:
    """Send N requests from N(mean, 1), wait for them, flush both workers; returns when
    the phase began (windows are 1 s; a phase starts two windows after the last one)."""
    await asyncio.sleep(2.1)
    began = time.time()
    rows = np.random.default_rng(seed).normal(mean, 1.0, size=(N, 10)).astype(np.float32)
    ids = await client.submit_many(MODEL, list(rows))
    done = await client.wait_many(ids, timeout=120)
    assert all(r.status == "succeeded" for r in done)
    for w in workers:
        await w.find(OutputStats).flush()
    return began


async def run_cli(*args: str, since: float | None = None) -> tuple[int, str, str]:
    """The CLI in process, on a thread (its own event loop). With ``since`` (a phase's
    start), ``--since-s`` is measured on that thread just before the command runs, plus
    one window of slack: on a loaded machine the command reads its clock a while after
    ours, and a window that closed in between would be left out. One window cannot reach
    the phase before (phases start two windows after it)."""
    def invoke() -> tuple[int, str, str]:
        extra = [] if since is None else ["--since-s", f"{time.time() - since + 1:.2f}"]
        got = CliRunner().invoke(app, [*args, *extra])
        return got.exit_code, got.stdout, str(got.exception or "")
    return await asyncio.to_thread(invoke)


async def test_two_workers_merge_exactly_and_drift_shows_against_the_baseline(
        redis_url: str) -> None:
    settings = {"max_wait_ms": 2, "stats_window_s": 1}
    async with running_worker(redis_url, models=(MODEL,), worker_id="q1", **settings) as w1, \
            running_worker(redis_url, models=(MODEL,), worker_id="q2", **settings) as w2, \
            AsyncClient(redis_url) as client:
        workers = (w1, w2)
        counted: list[int] = []

        def spy(mw: OutputStats) -> None:  # what each worker itself counted
            real = mw.record

            def record(model: str, label: str, outs: list, ins: list,  # type: ignore[type-arg]
                       now: float | None = None) -> None:
                counted.append(len(outs))
                real(model, label, outs, ins, now)
            mw.record = record  # type: ignore[method-assign]

        per_worker = []
        for w in workers:
            before = len(counted)
            spy(w.find(OutputStats))
            per_worker.append(before)
        a = await _phase(client, workers, 0.0, 1)
        plane = w1.context.plane
        rows = {r.version: r for r in await read_rows(plane, MODEL, time.time() - a + 1)}
        stable = rows["default"]
        assert stable.role == "stable" and stable.outputs.reference is None
        assert stable.outputs.summary.rows == sum(counted) == N
        assert stable.outputs.count == N  # one value per request
        assert stable.inputs.count == 10 * N
        assert stable.outputs.nan_count == 0
        await freeze_baseline(plane, MODEL, "default", time.time() - a + 1)

        b = await _phase(client, workers, 0.0, 2)  # the same distribution, new inputs
        same = {r.version: r for r in await read_rows(plane, MODEL, time.time() - b)}
        row = same["default"]
        assert row.outputs.reference == "baseline" and row.outputs.summary.rows == N
        psi = row.outputs.drift["psi"]
        assert psi is not None and psi < 0.02, row.outputs.drift
        in_psi = row.inputs.drift["psi"]
        assert in_psi is not None and in_psi < 0.02, row.inputs.drift

        c = await _phase(client, workers, 1.0, 3)  # inputs drift: N(0,1) -> N(1,1)
        code, out, err = await run_cli(
            "models", "outputs", MODEL, "--inputs", "--json", "--broker", redis_url, since=c)
        assert code == 0, err
        body = json.loads(out)
        assert [r["version"] for r in body] == ["default"]
        got = body[0]
        assert set(got) == {"version", "role", "reference", "count", "nan_rate", "mean", "p50",
                            "p99", "psi", "ks", "inputs"}
        assert got["reference"] == "baseline" and got["count"] == N
        assert got["inputs"]["psi"] > 0.25 and got["inputs"]["ks"] > 0.3, got
        assert got["inputs"]["mean"] == pytest.approx(1.0, abs=0.05)

        # the worker's gauges read the same fleet-merged drift (over its last 15 minutes)
        await w1.find(OutputStats).report()
        gauge = w1.metrics.output_drift.labels(MODEL, "default", "input_psi")._value.get()
        assert gauge > 0.1, gauge
        assert w1.metrics.output_nan_ratio.labels(MODEL, "default")._value.get() == 0.0

        code, out, err = await run_cli("models", "outputs", MODEL, "--inputs", "--broker",
                                       redis_url)
        assert code == 0, err
        assert "input psi" in out and "baseline" in out
