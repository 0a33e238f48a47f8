"""The compute thread: one forward at a time, off the event loop, under a timeout.

torch releases the GIL, so the loop keeps fetching and writing while a batch
computes. A thread cannot be killed: a batch past ``compute_timeout_s`` is
abandoned to a fresh thread's successor and its requests fail retryably; a
forward running longer than ``claim_idle_ms`` counts as stalled (leases lapse).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import structlog
import torch

from batchfleet.schemas.errors import ComputeTimeoutError
from batchfleet.workers.intake import Job
from batchfleet.workers.models import ModelHandler
from batchfleet.workers.runner import BatchRun, ModelRunner

THREAD_PREFIX = "compute"
log = structlog.get_logger("batchfleet.worker")


class ComputeThread:
    def __init__(self, handlers: Mapping[str, ModelHandler], device: torch.device,
                 timeout_s: float | None, stall_ms: int) -> None:
        self._runner = ModelRunner(handlers, device)
        self._timeout_s, self._stall_ms = timeout_s, stall_ms
        self._executor = _pool()
        self._since: float | None = None  # monotonic start of the running forward
        #: (model, size) of the batch computing now, for the in-flight gauge.
        self.computing: tuple[str, int] = ("", 0)

    @property
    def device(self) -> torch.device:
        return self._runner.device

    async def setup(self) -> dict[str, float]:
        """Load and warm up every model in the compute thread; seconds per model."""
        return await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                self._runner.setup)

    async def run(self, model: str, jobs: Sequence[Job]) -> BatchRun:
        """Run one batch in the compute thread, under the compute timeout if one is set."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._runner.run, model,
                                      [j.request.inputs for j in jobs])
        self._since, self.computing = time.monotonic(), (model, len(jobs))
        try:
            return await asyncio.wait_for(future, self._timeout_s)
        except TimeoutError:
            # Abandon the thread to finish on its own and carry on with a fresh one. Its
            # late output is discarded; the requests are retried.
            self._executor.shutdown(wait=False)
            self._executor = _pool()
            error = ComputeTimeoutError(f"batch of {len(jobs)} took longer than "
                                        f"{self._timeout_s}s")
            return BatchRun([error] * len(jobs), time.time(), float(self._timeout_s or 0), 1)
        finally:
            self._since, self.computing = None, ("", 0)

    def stalled(self) -> bool:
        """One forward running longer than ``claim_idle_ms``: the thread may be wedged."""
        since = self._since
        return since is not None and (time.monotonic() - since) * 1000.0 > self._stall_ms

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_PREFIX)


def compute_threads_outlive(wait_s: float) -> bool:
    """Whether a compute thread is still running ``wait_s`` after shutdown (idle pool threads
    exit at once on the shutdown sentinel; a busy one is inside a forward)."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = [t for t in threading.enumerate()
                if t.name.startswith(THREAD_PREFIX) and t.is_alive()]
        if not busy or time.monotonic() >= deadline:
            return bool(busy)
        time.sleep(0.02)


def leave_wedged_forward_behind(wait_s: float = 0.5) -> None:
    """At exit, after the loop stopped: a forward cannot be interrupted and interpreter exit
    would join its thread, so a wedged one would hold the process past the grace period.
    Leave it behind; its requests were not acked and are redelivered."""
    if compute_threads_outlive(wait_s):
        log.warning("exiting with a forward still running; its requests are redelivered")
        atexit._run_exitfuncs()  # flush the log writer, as a normal exit would
        os._exit(0)
