"""Threads beside the compute thread free their OpenMP pool after each use.

A thread that runs a parallel torch op gets a pool of OpenMP threads of its own and keeps
it for as long as it lives; once a process holds more OpenMP threads than cores, libgomp
makes every barrier of every forward on the compute thread sleep instead of spin
(docs/performance.md, "One OpenMP pool"). The preprocess thread, the shadow thread and
containment's aside thread are long-lived, so each frees its pool after each use. These
tests count the process's threads that Python did not start (OpenMP's helpers), not time;
a freed pool leaves no more of them than before ("at most": another test's abandoned
thread may exit meanwhile, its pool with it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.jobs import Job
from batchfleet.workers.middleware.shadow_thread import ShadowThread
from batchfleet.workers.models.handler import TorchModuleHandler
from batchfleet.workers.openmp import release_thread_pool

pytestmark = pytest.mark.unit

#: Elements enough for torch to split an elementwise op across its threads.
PARALLEL = 1 << 22


def _count() -> int:
    python = {t.native_id for t in threading.enumerate()}
    return sum(int(tid) not in python for tid in os.listdir("/proc/self/task"))


def native_threads(settle_s: float = 0.05, within_s: float = 10.0) -> int:
    """Threads of this process that Python did not start (OpenMP's helpers), once their
    number has held still for ``settle_s``: a freed pool's threads exit a moment after
    the release returns (longer on a busy machine)."""
    last, since = _count(), time.monotonic()
    deadline = since + within_s
    while time.monotonic() < deadline:
        time.sleep(0.005)
        now = _count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            break
    return last


def parallel_op() -> None:
    torch.ones(PARALLEL).mul_(2)


def _on_a_thread(fn: Any) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join(30)


@pytest.fixture(autouse=True)
def _pools_possible() -> None:
    if not os.path.isdir("/proc/self/task") or torch.get_num_threads() < 2:
        pytest.skip("needs Linux and at least 2 torch threads: no pool to free otherwise")
    seen: dict[str, Any] = {}

    def probe() -> None:
        parallel_op()
        seen["freed"] = release_thread_pool()

    _on_a_thread(probe)
    if not seen.get("freed"):
        pytest.skip("torch's OpenMP runtime here is not libgomp: nothing is freed")


def test_a_thread_that_ran_a_parallel_op_frees_its_pool() -> None:
    seen: dict[str, int] = {}

    def side() -> None:
        before = native_threads()
        parallel_op()
        seen["with a pool"] = native_threads() - before
        release_thread_pool()
        seen["freed"] = native_threads() - before
        release_thread_pool()  # no pool: nothing to do
        parallel_op()  # and a pool comes back when needed
        seen["again"] = native_threads() - before
        release_thread_pool()

    _on_a_thread(side)
    assert seen["with a pool"] >= 1
    assert seen["freed"] <= 0
    assert seen["again"] >= 1


async def test_the_shadow_thread_keeps_no_pool_between_forwards() -> None:
    shadow = ShadowThread()
    try:
        await shadow.run(lambda: None)  # the shadow thread itself, started
        before = native_threads()

        def forward() -> int:
            parallel_op()
            return native_threads() - before

        assert await shadow.run(forward) >= 1  # the forward had a pool
        assert native_threads() <= before  # and it was freed before the answer

        def failing() -> None:
            parallel_op()
            raise RuntimeError("shadow forward failed")

        with pytest.raises(RuntimeError, match="shadow forward failed"):
            await shadow.run(failing)
        assert native_threads() <= before  # freed after a forward that raised, too
    finally:
        shadow.shutdown()


class ParallelPreprocess(TorchModuleHandler):
    """A handler whose preprocess runs a parallel op for a row of 3s, its forward for a
    row of 7s. Its preprocess runs on the prepare thread, as a custom handler's does."""

    preprocess_on_device = False

    def __init__(self) -> None:
        super().__init__("p", Times7(), input_spec=TensorSpec("float32", (2,)))

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        if any(float(np.asarray(x)[0]) == 3 for x in inputs):
            parallel_op()
        return super().preprocess(inputs)


class Times7(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == 7).any()):
            parallel_op()
        return x * 7


def _jobs(value: float) -> list[Job]:
    return [Job(Delivery("p", "interactive", b"", token=None),
                Request("r1", "p", np.full(2, value, np.float32)))]


async def test_the_prepare_and_aside_threads_keep_no_pool_between_batches() -> None:
    compute = ComputeThread({"p": ParallelPreprocess()}, torch.device("cpu"))
    try:
        await compute.setup()
        await compute.run("p", _jobs(1.0))  # compute and prepare threads started
        before = native_threads()
        run = await compute.run("p", _jobs(3.0))  # a parallel preprocess
        assert run.outputs[0].tolist() == [21, 21]  # type: ignore[union-attr]
        assert native_threads() <= before
        run = await compute.run_aside("p", _jobs(7.0))  # a parallel forward, aside
        assert run.outputs[0].tolist() == [49, 49]  # type: ignore[union-attr]
        assert native_threads() <= before
    finally:
        compute.shutdown()


async def test_off_the_cpu_the_prepare_thread_keeps_its_pool() -> None:
    """A forward on a GPU crosses no OpenMP barrier: there a preprocess keeps its pool
    rather than build it again each batch ("meta" stands in for a device here)."""
    compute = ComputeThread({"p": ParallelPreprocess()}, torch.device("meta"))
    try:
        await compute._prepared("p", [np.full(2, 1.0, np.float32)], 30.0)  # thread started
        before = native_threads()
        await compute._prepared("p", [np.full(2, 3.0, np.float32)], 30.0)
        assert native_threads() > before
    finally:
        compute.shutdown()
        compute._prepare.shutdown(wait=True)  # its pool goes with it, before other tests
