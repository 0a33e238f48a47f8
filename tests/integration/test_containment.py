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

from batchfleet.connectors import open_result_store
from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.errors import ComputeTimeoutError, StalledError
from batchfleet.schemas.names import Names
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.compute_limits import NO_HISTORY_S, ComputeLimits
from batchfleet.workers.containment import Containment
from batchfleet.workers.intake import Job
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun

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
    """Two aside runs of 1 s each under a 1.5 s limit: the second waits 1 s for the thread
    and still finishes (its limit once ran from submit, so it stalled at 1.5 s)."""
    compute = _compute(1.5)
    try:
        first, second = await asyncio.gather(compute.run_aside(MODEL, _jobs(1.0)),
                                             compute.run_aside(MODEL, _jobs(1.0)))
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
    compute = _compute(0.5)
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
    compute = _compute(0.5)
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
