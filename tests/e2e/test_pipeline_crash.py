"""A pipeline's steps spread over two worker processes, one SIGKILLed mid-run: every
request ends exactly once, and every step is in its ``steps`` list once, on Redis and on
Kafka."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.processes import WorkerProcess
from batchfleet.workers.models.builtin import build_mlp
from tests.e2e.test_pipelines import declare
from tests.support.pipeline_models import build_mix
from tests.support.transports import KAFKA_SESSION_MS

pytestmark = pytest.mark.e2e
MIX = "mix=tests.support.pipeline_models:mix"
STEPS = ["mix", "mix-2", "demo-mlp"]


def worker(broker: str, results: str, namespace: str, model: str, *extra: str
           ) -> WorkerProcess:
    return WorkerProcess(broker, results, models=(model,), namespace=namespace, extra_args=(
        "--claim-idle-ms", "500", "--max-batch-size", "16", "--max-wait-ms", "2", *extra))


async def run_with_a_kill(broker: str, results: str, ns: str, n: int,
                          *extra: str) -> tuple[np.ndarray, list[Any], bool]:
    """Submit ``n`` to mix,mix,demo-mlp with mix on one process and demo-mlp on another;
    SIGKILL the mix worker once some but not all are done, and start a new one."""
    await declare(results, ns, "crashy", "mix,mix,demo-mlp")
    rows = np.random.default_rng(11).random((n, 10), dtype=np.float32)
    first = worker(broker, results, ns, MIX, *extra).start()
    second = worker(broker, results, ns, "demo-mlp", *extra).start()
    spare: WorkerProcess | None = None
    try:
        await asyncio.gather(asyncio.to_thread(first.wait_ready),
                             asyncio.to_thread(second.wait_ready))
        async with AsyncClient(broker, results, namespace=ns) as client:
            ids = await client.submit_many("crashy", list(rows))
            sample = ids[:: max(1, n // 50)]
            mid_run = False
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = [await client.get(rid) for rid in sample]
                done = sum(1 for r in got if r is not None and r.status != "pending")
                if done:
                    mid_run = done < len(sample)
                    break
                await asyncio.sleep(0.02)
            first.kill()
            spare = worker(broker, results, ns, MIX, *extra).start()
            out = await client.wait_many(ids, timeout=240)
    finally:
        for w in (first, second, spare):
            if w is not None:
                w.kill()
    return rows, out, mid_run


def composed(rows: np.ndarray) -> np.ndarray:
    mix, mlp = build_mix(), build_mlp()
    with torch.no_grad():
        return mlp(mix(mix(torch.from_numpy(rows)))).numpy()  # type: ignore[no-any-return]


def check_exactly_once(rows: np.ndarray, results: list[Any]) -> None:
    assert [r.status for r in results] == ["succeeded"] * len(rows), [
        (r.request_id, r.status, r.error) for r in results if r.status != "succeeded"][:5]
    for r in results:
        assert [s["step"] for s in r.steps] == STEPS, r.steps
    np.testing.assert_allclose(np.stack([np.asarray(r.outputs) for r in results]),
                               composed(rows), rtol=1e-5, atol=1e-6)


async def test_sigkill_mid_pipeline_on_redis_loses_and_doubles_nothing(redis_url: str) -> None:
    rows, results, mid_run = await run_with_a_kill(redis_url, redis_url, "pk", 3000)
    assert mid_run, "the kill came after every sampled request had finished"
    check_exactly_once(rows, results)


@pytest.mark.kafka
async def test_sigkill_mid_pipeline_on_kafka_loses_and_doubles_nothing(
        redis_url: str, kafka_broker: str) -> None:
    """Kafka cannot commit a result and the next step's message together: the hand-off
    before the step's write, redelivery from the committed offsets, and first-wins are
    the mechanism (docs/pipelines.md)."""
    ns = f"pk{uuid.uuid4().hex[:8]}"  # topics and groups outlive a test on the broker
    rows, results, mid_run = await run_with_a_kill(
        f"kafka://{kafka_broker}", redis_url, ns, 1500,
        "--kafka-session-timeout-ms", str(KAFKA_SESSION_MS))
    assert mid_run, "the kill came after every sampled request had finished"
    check_exactly_once(rows, results)
