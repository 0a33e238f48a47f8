"""The compute thread: one forward at a time, off the event loop, under a limit.

torch releases the GIL, so the loop keeps fetching and writing while a batch
computes. Every batch runs under its model's compute limit (``compute_limits``:
``--compute-timeout-s`` or learned from the model's own batch times). A Python
thread cannot be interrupted or killed, least of all inside C (a CUDA kernel, a
driver call, a ``time.sleep``): a batch past its limit is *abandoned* with its
thread, which is kept as *stuck* until it returns, and the next batch gets a fresh
thread. A handler's ``preprocess`` runs before, on a thread of its own (``_prepared``),
so CPU-bound preprocessing does not hold the device. ``run_aside`` is a second thread,
for re-running a stalled batch's requests one by one (``workers.containment``) while
the main thread serves other batches. Both free their OpenMP pool after each use on a CPU
device (``workers.openmp.release_thread_pool``): an idle pool beside the compute thread's
makes its every barrier sleep.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
import torch

from batchfleet.connectors.cancelling import bounded
from batchfleet.schemas.errors import ComputeTimeoutError
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.compute_limits import ComputeLimits
from batchfleet.workers.jobs import Job
from batchfleet.workers.models import ModelHandler
from batchfleet.workers.models.handler import preprocess_on_device
from batchfleet.workers.models.lazy import Built, ResidentHandler
from batchfleet.workers.openmp import release_thread_pool
from batchfleet.workers.runner import BatchRun, ModelRunner, Prepared

THREAD_PREFIX = "compute"
T = TypeVar("T")
log = structlog.get_logger("batchfleet.worker")


@dataclass(slots=True)
class Stuck:
    """A thread abandoned inside a forward that overran its limit."""

    lane: str
    #: ``time.monotonic()`` when it was abandoned (its batch's limit had passed).
    since: float
    future: asyncio.Future[Any]


class ComputeThread:
    def __init__(self, handlers: Mapping[str, ModelHandler], device: torch.device,
                 limits: ComputeLimits | None = None,
                 executor: ThreadPoolExecutor | None = None) -> None:
        self._runner = ModelRunner(handlers, device)
        self.limits = limits or ComputeLimits()
        #: The main thread (the shadow queues its runs here too): ``executor`` where the
        #: models were built on it (``compute_pool``), else a new one.
        self._executor = executor or _pool()
        self._aside: ThreadPoolExecutor | None = None
        #: Where a handler's ``preprocess`` runs before the device is taken (not the
        #: built-in module handler's: its collation is a copy to the device).
        self._prepare = _pool(f"{THREAD_PREFIX}-prepare")
        self._stuck: list[Stuck] = []
        #: (model, size) of the batch computing now, for the in-flight gauge.
        self.computing: tuple[str, int] = ("", 0)

    @property
    def device(self) -> torch.device:
        return self._runner.device

    @property
    def lanes(self) -> list[str]:
        return list(self._runner.handlers)

    async def setup(self) -> dict[str, float]:
        """Load and warm up every model in the compute thread; seconds per model."""
        return await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                self._runner.setup)

    async def run(self, model: str, jobs: Sequence[Job]) -> BatchRun:
        """Run one batch on the main thread, under the model's limit. Past it, the batch
        comes back ``stalled`` (every request a retryable ``ComputeTimeoutError``) and the
        main thread is replaced."""
        self.computing = (model, len(jobs))
        try:
            run = await self._run(self._executor, model, jobs)
        finally:
            self.computing = ("", 0)
        if run.stalled:
            self._executor = _pool()
        else:  # batch times only: one-row aside runs would pull the limit towards them
            self.limits.record(model, run.compute_s)
        return run

    async def run_aside(self, model: str, jobs: Sequence[Job]) -> BatchRun:
        """Like :meth:`run`, on the second thread (replaced in turn when it stalls)."""
        if self._aside is None:
            self._aside = _pool("compute-aside")
        run = await self._run(self._aside, model, jobs, release_pool=True)
        if run.stalled:
            self._aside = None
        return run

    async def _run(self, executor: ThreadPoolExecutor, model: str,
                   jobs: Sequence[Job], release_pool: bool = False) -> BatchRun:
        limit = self.limits.limit_s(model)
        loop = asyncio.get_running_loop()
        inputs = [j.request.inputs for j in jobs]
        prepared = await self._prepared(model, inputs, limit)
        took: list[float] = []  # when the thread took the batch (monotonic)

        def forward() -> BatchRun:
            took.append(time.monotonic())
            try:
                return self._runner.run(model, inputs, prepared)
            finally:
                if release_pool:
                    release_thread_pool()

        future = loop.run_in_executor(executor, forward)
        try:
            run = await within_limit(future, took, limit)
        except TimeoutError:
            # its thread exits once the forward returns; a batch never taken is dropped
            executor.shutdown(wait=False, cancel_futures=True)
            future.add_done_callback(_retrieve)
            self._stuck.append(Stuck(model, time.monotonic(), future))
            log.warning("compute stalled: batch past its limit; its thread is abandoned",
                        model=model, size=len(jobs), limit_s=round(limit, 3))
            error = ComputeTimeoutError(f"batch of {len(jobs)} took longer than {limit:g}s")
            return BatchRun([error] * len(jobs), time.time() - limit, limit, 1, stalled=True)
        return run

    async def _prepared(self, model: str, inputs: list[Tensors],
                        limit: float) -> Prepared | None:
        """The batch preprocessed on its own thread, so the device is not held meanwhile;
        None for a handler that preprocesses on the device. A preprocess past the batch's
        limit is abandoned with its thread: the compute thread then preprocesses under the
        limit, and the stall is contained as any other."""
        if preprocess_on_device(self._runner.handlers[model]):
            return None
        pool = self._prepare
        # Only a CPU forward crosses OpenMP barriers: on a GPU a preprocess keeps its pool
        # (freeing a pool and building it again took about 45 us with one helper thread on
        # 2 cores; a 16-core host's pool has 15).
        release = self.device.type == "cpu"

        def prepare() -> Prepared:
            try:
                return self._runner.prepare(model, inputs)
            finally:
                if release:
                    release_thread_pool()

        future = asyncio.get_running_loop().run_in_executor(pool, prepare)
        try:
            return await bounded(asyncio.shield(future), limit)
        except TimeoutError:
            # Only our own preprocess is given up (one never taken never runs). The pool
            # is shared by the main lane, the aside lane and the shadow: their queued
            # preprocesses are not cancelled; they run once the stuck thread returns, or
            # time out on their own limits. New ones go to a fresh pool.
            future.cancel()
            future.add_done_callback(_retrieve)
            if self._prepare is pool:  # not yet replaced by an earlier timeout
                self._prepare = _pool(f"{THREAD_PREFIX}-prepare")
                pool.shutdown(wait=False)
            return None

    async def load(self, slots: Sequence[str], warmup_sizes: Sequence[int]) -> list[Built]:
        """Build, set up and warm up these versions (``ResidentHandler``s) on a loader
        thread, so other models' batches go on computing meanwhile; then attach them on
        the compute thread, which owns the handlers. What a build raises is raised here,
        with nothing attached."""
        loop = asyncio.get_running_loop()
        handlers = [self._runner.handlers[slot] for slot in slots]
        with _loader() as loader:
            built = [await loop.run_in_executor(loader, _resident(h).build, self.device,
                                                warmup_sizes) for h in handlers]

        def attach() -> None:
            for handler, one in zip(handlers, built, strict=True):
                _resident(handler).attach(one.handler)
        await loop.run_in_executor(self._executor, attach)
        return built

    async def swap(self, slot: str, make: Callable[[], ModelHandler], tag: str, source: str,
                   warmup_sizes: Sequence[int], sample: str = "") -> Built | None:
        """Serve a new version of a ``ResidentHandler`` (``make`` builds it): where one is
        loaded, the new one is built and warmed up on the loader thread and takes over on
        the compute thread between two batches (the old one's batches finish on it);
        where none is, it is only built once to learn its version. What a build raises is
        raised here, the old version still serving."""
        loop = asyncio.get_running_loop()
        handler = _resident(self._runner.handlers[slot])
        with _loader() as loader:
            if not handler.resident:
                probe = await loop.run_in_executor(loader, make)
                handler.retarget(make, tag, source, probe, sample)
                return None
            built = await loop.run_in_executor(loader, handler.build, self.device,
                                               warmup_sizes, make, sample)

        def attach() -> None:
            handler.retarget(make, tag, source, sample=sample)
            handler.attach(built.handler)
        await loop.run_in_executor(self._executor, attach)
        return built

    async def unload(self, slots: Sequence[str]) -> None:
        """Drop these versions' handlers, on the compute thread (after any batch queued
        there before): the caller has made sure none of theirs is in flight."""
        handlers = [_resident(self._runner.handlers[slot]) for slot in slots]

        def detach() -> None:
            for handler in handlers:
                handler.detach()
        await asyncio.get_running_loop().run_in_executor(self._executor, detach)

    def stuck(self) -> dict[str, float]:
        """Lanes with a thread still stuck, and for how long since it was abandoned (the
        longest, where a lane has several). A thread that returned is forgotten."""
        self._stuck = [s for s in self._stuck if not s.future.done()]
        now, out = time.monotonic(), dict[str, float]()
        for s in self._stuck:
            out[s.lane] = max(out.get(s.lane, 0.0), now - s.since)
        return out

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._prepare.shutdown(wait=False, cancel_futures=True)
        if self._aside is not None:
            self._aside.shutdown(wait=False, cancel_futures=True)


def _resident(handler: ModelHandler) -> ResidentHandler:
    if not isinstance(handler, ResidentHandler):
        raise TypeError(f"model {handler.name!r} is not loaded on demand")
    return handler


async def within_limit(future: asyncio.Future[T], took: Sequence[float], limit_s: float) -> T:
    """``future``'s result once it is done within ``limit_s`` of when its thread took the
    batch (``took``, stamped there); ``TimeoutError`` past that, or when no thread took it
    within ``limit_s`` of now. A batch queued behind another is not charged for that wait,
    nor for a hang ahead of it past one more limit.

    The thread's stamp is read at the deadlines instead of the thread waking the loop
    when it starts: one wake-up of the loop per batch, not two. ``future`` is never
    cancelled here: it stays the caller's, and says when an abandoned thread returns."""
    deadline = time.monotonic() + limit_s
    while not future.done():
        await asyncio.wait((future,), timeout=max(0.0, deadline - time.monotonic()))
        if future.done():
            break
        if not took or took[0] + limit_s <= time.monotonic():
            raise TimeoutError
        deadline = took[0] + limit_s
    return future.result()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An abandoned forward's late outcome is discarded; read it so asyncio does not warn."""
    if not future.cancelled():
        future.exception()


def _pool(prefix: str = THREAD_PREFIX) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=prefix)


@contextmanager
def _loader() -> Iterator[ThreadPoolExecutor]:
    """A thread for one on-demand load or swap, which exits after it: a thread that has
    run a warm-up forward holds an OpenMP pool until it exits (``compute_pool``)."""
    loader = _pool(f"{THREAD_PREFIX}-loader")
    try:
        yield loader
    finally:
        loader.shutdown(wait=False)


def compute_pool() -> ThreadPoolExecutor:
    """The compute thread, before its :class:`ComputeThread`: build the models on it.

    OpenMP gives every thread that runs a parallel torch op a pool of its own, and once a
    process holds more OpenMP threads than it has cores, each of them waits at a barrier
    by sleeping rather than spinning (libgomp's throttled spin). A model built on the
    main thread (its initialisers run parallel) leaves the main thread's pool idle beside
    the compute thread's, and on a 2-core machine that made every forward of
    demo-encoder sleep and wake about 135 times (docs/performance.md, "One OpenMP pool").
    """
    return _pool()


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


def abandon_loading_models(wait_s: float = 0.5) -> None:
    """Ctrl-C while the models build on the compute thread (``compute_pool``): that thread
    cannot be interrupted and interpreter exit would join it, so exit now (status 130, as
    Python's own) rather than when the load ends."""
    _exit_past_compute_threads(
        wait_s, 130, "interrupted while the models load; exiting without waiting for them")


def leave_wedged_forward_behind(wait_s: float = 0.5, exit_code: int = 0) -> None:
    """At exit, after the loop stopped: a forward cannot be interrupted and interpreter exit
    would join its thread, so a wedged one would hold the process past the grace period.
    Leave it behind; its requests were answered, retried or left unacked (redelivered)."""
    _exit_past_compute_threads(
        wait_s, exit_code, "exiting with a forward still running; its requests are redelivered")


def _exit_past_compute_threads(wait_s: float, exit_code: int, why: str) -> None:
    """Exit with ``exit_code`` now, without joining a compute thread still busy after
    ``wait_s``; return where none is."""
    if compute_threads_outlive(wait_s):
        log.warning(why, exit_code=exit_code)
        atexit._run_exitfuncs()  # flush the log writer, as a normal exit would
        os._exit(exit_code)
