"""SLO-driven batch closing (``--latency-slo-ms``) with a real worker on a real Redis.

The controller's SLO guarantee is proved on synthetic traces in tests/unit/test_slo.py;
here a live worker shows it is wired in: every request succeeds, the fleet-side latency
stays within a generous bound of the SLO at a steady rate (machines are noisy: a
liveness check, not a benchmark), a burst is batched, the gauge is exported, and the CLI
takes the option and refuses bad values in one line.
"""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
import pytest

from batchfleet.producers import AsyncClient
from batchfleet.workers.batching import FixedWait
from batchfleet.workers.middleware.slo import SloBatching
from batchfleet.workers.per_model import PerModel
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

SLO_MS = 50.0


async def test_a_worker_with_an_slo_keeps_latency_bounded_and_batches_a_burst(
        redis_url: str) -> None:
    rng = np.random.default_rng(15)
    slo_ms = PerModel(None, ((("demo-mlp", None), SLO_MS),))
    async with running_worker(redis_url, latency_slo_ms=slo_ms, max_batch_size=64) as worker, \
            AsyncClient(broker=redis_url) as client:
        slo = worker.find(SloBatching)
        assert worker.batcher.policy is slo
        # steady and moderate: ~100 requests/s for ~2 s, one at a time
        steady: list[str] = []
        for _ in range(200):
            steady.append(await client.submit("demo-mlp", rng.random(10, dtype=np.float32)))
            await asyncio.sleep(0.01)
        steady_results = await client.wait_many(steady, timeout=60)
        # a burst: everything at once
        burst = await client.submit_many("demo-mlp", rng.random((400, 10), dtype=np.float32))
        burst_results = await client.wait_many(burst, timeout=60)
        exposition = worker.metrics.exposition().decode()
        waits = slo.vitals()["batch_close_wait_ms"]
    assert {r.status for r in steady_results + burst_results} == {"succeeded"}
    latencies_ms = [(r.finished_at - r.enqueued_at) * 1000.0 for r in steady_results
                    if r.finished_at is not None]
    assert len(latencies_ms) == len(steady)
    assert max(latencies_ms) <= 5 * SLO_MS, sorted(latencies_ms)[-5:]
    sizes = [r.batch_size or 0 for r in burst_results]
    assert sum(sizes) / len(sizes) > 1
    assert 'batchfleet_batch_close_wait_ms{model="demo-mlp"}' in exposition
    assert set(waits) == {"demo-mlp"} and 0.0 <= waits["demo-mlp"] < SLO_MS


async def test_without_an_slo_the_batcher_keeps_the_fixed_wait(redis_url: str) -> None:
    async with running_worker(redis_url) as worker:
        assert isinstance(worker.batcher.policy, FixedWait)
        assert worker.batcher.policy.max_wait_s == worker.settings.max_wait_ms / 1000.0
        with pytest.raises(LookupError):
            worker.find(SloBatching)


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=os.environ | {"COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_cli_takes_the_option_and_refuses_bad_values_in_one_line() -> None:
    code, out, err = await _cli("worker", "--help")
    assert code == 0, err
    assert "--latency-slo-ms" in out
    code, out, err = await _cli("worker", "--broker", "redis://h:1/0", "--latency-slo-ms",
                                "demo-mlp=20", "--print-config")
    assert code == 0, err
    assert "latency_slo_ms[demo-mlp] = 20.0" in out.splitlines()
    for bad, says in (("-5", "must be a positive number of milliseconds"),
                      ("demo-mlp=0", "must be a positive number of milliseconds"),
                      ("demo-mlp=soon", "expected milliseconds"),
                      ("nope=20", "--latency-slo-ms names 'nope'")):
        code, _, err = await _cli("worker", "--broker", "redis://h:1/0", "--latency-slo-ms",
                                  bad, "--print-config")
        assert code == 2, (bad, err)
        assert says in err and "Traceback" not in err, (bad, err)
        assert len(err.strip().splitlines()) == 1, (bad, err)
