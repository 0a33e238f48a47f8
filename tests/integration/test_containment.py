"""Containment and the compute threads on real threads, a real torch module and a real
Redis (the worker end to end: tests/e2e/test_hang.py, tests/e2e/test_failures.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import nn

from batchfleet.connectors.broker import Delivery
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.errors import ComputeTimeoutError, StalledError
from batchfleet.schemas.names import Names
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.compute_limits import NO_HISTORY_S, ComputeLimits
from batchfleet.workers.containment import Containment
from batchfleet.workers.intake import Job
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.middleware.stuck import StuckCompute
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker
from tests.support.seams import open_result_store

pytestmark = pytest.mark.integration

MODEL = "sleeps"
#: A row's first feature: how long its batch sleeps, in seconds (a "hang" here is 3 s:
#: long past the limits below, short enough that the abandoned thread ends in the test).
HANG_S = 3.0


class Sleeps(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(x[:, 0].max()))
        return x[:, :1]


def _compute(limit_s: float | None) -> ComputeThread:
    handler = TorchModuleHandler(MODEL, Sleeps(), input_spec=TensorSpec("float32", (2,)))
    return ComputeThread({MODEL: handler}, torch.device("cpu"),
                         ComputeLimits(PerModel(limit_s)))


def _jobs(*sleeps: float, prefix: str = "r") -> list[Job]:
    return [Job(Delivery(MODEL, "interactive", b"", token=None),
                Request(f"{prefix}{i}", MODEL, np.array([s, 0.0], np.float32)))
            for i, s in enumerate(sleeps)]


def _stalled(jobs: Sequence[Job]) -> BatchRun:
    """What ``ComputeThread.run`` hands over for a batch past its limit."""
    return BatchRun([ComputeTimeoutError("past")] * len(jobs), time.time(), 0.5, 1,
                    stalled=True)


async def test_a_batch_queued_behind_another_gets_its_whole_limit_from_pickup() -> None:
    """Two aside runs of 1.2 s each under a 2 s limit: the second waits 1.2 s for the
    thread and still finishes (its limit once ran from submit, so it stalled at 2 s). The
    0.8 s to spare is for a busy CI box: with 0.5 s, one run there saw the first stall."""
    compute = _compute(2.0)
    try:
        first, second = await asyncio.gather(compute.run_aside(MODEL, _jobs(1.2)),
                                             compute.run_aside(MODEL, _jobs(1.2)))
    finally:
        compute.shutdown()
    assert (first.stalled, second.stalled) == (False, False)
    assert compute.stuck() == {}


async def test_only_batches_on_the_main_thread_teach_the_limit() -> None:
    compute = _compute(None)
    try:
        for _ in range(6):  # past MIN_HISTORY: the limit would be learned
            await compute.run_aside(MODEL, _jobs(0.0))
        assert compute.limits.limit_s(MODEL) == NO_HISTORY_S
        for _ in range(6):
            await compute.run(MODEL, _jobs(0.0))
        assert compute.limits.limit_s(MODEL) < NO_HISTORY_S
    finally:
        compute.shutdown()


async def test_two_containments_take_turns_and_charge_no_innocent(redis_url: str) -> None:
    """One batch holds a hang, another stalled beside it holds only a fine request: the
    fine one is answered, never queued behind the hang and quarantined for it."""
    store = open_result_store(redis_url, Names())
    compute = _compute(1.0)
    contain = Containment(compute, store.note_stalls)
    hung, fine = _jobs(HANG_S, 0.0, prefix="a"), _jobs(0.0, prefix="b")
    try:
        a, b = await asyncio.gather(contain.contain(MODEL, hung, _stalled(hung)),
                                    contain.contain(MODEL, fine, _stalled(fine)))
    finally:
        compute.shutdown()
        await store.close()
    assert isinstance(a.outputs[0], StalledError)  # stalled alone after being implicated
    assert isinstance(a.outputs[1], ComputeTimeoutError)  # not run: retried
    assert isinstance(b.outputs[0], np.ndarray | torch.Tensor)
    assert contain.quarantined == 1


async def test_a_request_implicated_before_is_quarantined_without_a_run_alone(
        redis_url: str) -> None:
    """In a batch of two, the request already implicated once is quarantined at once (no
    thread is left stuck on it); its neighbour is run alone and answered."""
    store = open_result_store(redis_url, Names())
    compute = _compute(1.0)
    contain = Containment(compute, store.note_stalls)
    jobs = _jobs(HANG_S, 0.0, prefix="c")
    try:
        assert await store.note_stalls(["c0"]) == [1]  # a stall on a worker that died
        run = await contain.contain(MODEL, jobs, _stalled(jobs))
    finally:
        compute.shutdown()
        await store.close()
    assert isinstance(run.outputs[0], StalledError) and "2 times" in str(run.outputs[0])
    assert isinstance(run.outputs[1], np.ndarray | torch.Tensor)
    assert compute.stuck() == {} and contain.quarantined == 1


class _BreaksAfterAStall(Middleware):
    """A middleware whose ``after_compute`` raises on a contained batch."""

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        if run.stalled:
            raise RuntimeError("after_compute broke on a contained batch")


async def test_a_crash_finishing_a_contained_batch_stops_the_worker(redis_url: str) -> None:
    """Once contained, a batch's own finish that raises lets its deliveries go and stops
    the worker (redelivery heals), as a crashed completion does, never silently (its
    leases were refreshed for good, so no worker reclaimed them)."""
    handler = TorchModuleHandler(MODEL, Sleeps(), input_spec=TensorSpec("float32", (2,)))
    settings = WorkerSettings.from_url(redis_url, device="cpu", max_wait_ms=50,
                                       compute_timeout_s=PerModel(0.5))
    worker = Worker(settings, {MODEL: handler}, middleware=[
        *default_middleware(settings, [MODEL]), _BreaksAfterAStall()])
    task = asyncio.create_task(worker.async_run())
    await asyncio.wait_for(worker.ready.wait(), 60)
    async with AsyncClient(redis_url) as client:
        await client.submit_many(MODEL, [np.array([HANG_S, 0.0], np.float32),
                                         np.array([0.0, 0.0], np.float32)])
        done, _ = await asyncio.wait({task}, timeout=20)  # liveness bound only
    if not done:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    assert done, "the worker went on with a contained batch's deliveries held for good"
    with pytest.raises(RuntimeError, match="after_compute broke"):
        task.result()


async def test_a_stuck_thread_pauses_only_the_models_asked_about(redis_url: str) -> None:
    handler = TorchModuleHandler(MODEL, Sleeps(), input_spec=TensorSpec("float32", (2,)))
    settings = WorkerSettings.from_url(redis_url, device="cpu",
                                       compute_timeout_s=PerModel(0.3))
    worker = Worker(settings, {MODEL: handler})
    stuck = StuckCompute(exit_after_s=60)
    await stuck.on_start(worker)
    try:
        [lane] = worker.compute.lanes  # MODEL@default
        assert (await worker.compute.run(lane, _jobs(HANG_S, prefix="s"))).stalled
        assert stuck.paused_models(frozenset({MODEL, "other"})) == {MODEL}
        assert stuck.paused_models(frozenset({"other"})) == frozenset()
    finally:
        worker.compute.shutdown()
