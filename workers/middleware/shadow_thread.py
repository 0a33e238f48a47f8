"""Where shadow forwards run, how much of the clock they may take, and what they cost.

A shadow forward must never hold the compute slot that stable batches wait for (a
shadow that waits 0.5 s on a remote model or a GPU would otherwise delay every stable
batch behind it), so it runs on a thread of its own, :class:`ShadowThread`, one batch
at a time. A daemon thread, so a wedged shadow never holds the process at exit. After
each forward it frees its OpenMP pool (``workers.openmp.release_thread_pool``): an idle
pool beside the compute thread's makes every barrier of every stable forward sleep.

A thread of its own still shares the cores: :class:`ShadowBudget` caps each model's
shadow at a share of wall time (after a forward of ``d`` seconds the model's shadow
rests ``d * (1 - share) / share``), which bounds the CPU a CPU-bound shadow can take.
:func:`delayed_by` decides what the issue calls a *delayed stable batch*: handed to
compute while a shadow forward was running, and queued behind it: its forward ran on the
thread the shadow forward held, and started only once that forward ended. (Wall-clock
order alone would count a batch that merely started a moment after a shadow on another
thread ended, as a busy machine's scheduling makes happen now and then.)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.openmp import release_thread_pool
from batchfleet.workers.per_model import PerModel

T = TypeVar("T")
#: ``--shadow-budget``'s default: a model's shadow forwards take at most this share of
#: wall time (on a busy CPU, at most about this share of the cores they use).
DEFAULT_SHARE = 0.25
DEFAULT_BUDGET: PerModel[float | None] = PerModel(DEFAULT_SHARE)
THREAD_NAME = "shadow"

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]", "Span"]


@dataclass(slots=True)
class Span:
    """One shadow forward's wall-clock interval (``end`` None while it runs) and the
    thread it ran on (``threading.get_ident()``; None until a thread takes it)."""

    start: float
    end: float | None = None
    thread: int | None = None


class ShadowThread:
    """One daemon thread that runs shadow forwards one at a time, apart from compute."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[_Job | None] = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        #: The forward running (or handed over) now; None when the thread is idle.
        self.current: Span | None = None

    @property
    def busy(self) -> bool:
        return self.current is not None

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``fn`` on the shadow thread; the caller checks :attr:`busy` first (one at a
        time: the queue holds one job, and a second raises ``queue.Full``)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            self._thread.start()
        span = self.current = Span(time.time())
        self._inbox.put_nowait((fn, loop, future, span))
        future.add_done_callback(lambda _: self._idle(span))
        return future

    def _idle(self, span: Span) -> None:
        if self.current is span:
            self.current = None

    def _serve(self) -> None:
        while (job := self._inbox.get()) is not None:
            fn, loop, future, span = job
            span.thread = threading.get_ident()
            try:
                settle: Callable[[], Any] = _result(future, fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                settle = _error(future, exc)
            span.end = time.time()
            release_thread_pool()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle)

    def shutdown(self) -> None:
        """Let the thread end after the forward it runs (an idle one ends at once)."""
        with contextlib.suppress(queue.Full):  # a job not yet taken: a daemon, let it be
            self._inbox.put_nowait(None)


def _result(future: asyncio.Future[Any], value: Any) -> Callable[[], None]:
    return lambda: None if future.done() else future.set_result(value)


def _error(future: asyncio.Future[Any], exc: BaseException) -> Callable[[], None]:
    return lambda: None if future.done() else future.set_exception(exc)


class ShadowBudget:
    """Per model, a share of wall time its shadow forwards may take (``--shadow-budget``):
    after a forward of ``d`` s the shadow rests ``d * (1 - share) / share``; a stable batch
    that finds it resting is skipped. Share 0: never run here; None: no rest."""

    def __init__(self, shares: PerModel[float | None]) -> None:
        for share in (shares.default, *(v for _, v in shares.overrides)):
            if share is not None and not 0.0 <= share <= 1.0:
                raise ConfigError(f"--shadow-budget {share}: expected a share of wall time "
                                  f"from 0 to 1 (0: never run the shadow; none: no limit)")
        self._shares = shares
        self._rest_until: dict[str, float] = {}

    def share(self, model: str, shadow: str | None = None) -> float:
        """``MODEL@SHADOW=`` names the shadow version's share, ``MODEL=`` the model's."""
        share = self._shares.for_model(model, shadow)
        return 1.0 if share is None else share

    def allows(self, model: str, shadow: str, now: float) -> bool:
        return self.share(model, shadow) > 0.0 and now >= self._rest_until.get(model, 0.0)

    def spent(self, model: str, shadow: str, seconds: float, now: float) -> None:
        share = self.share(model, shadow)
        if share > 0.0:
            self._rest_until[model] = now + seconds * (1.0 - share) / share


def delayed_by(span: Span | None, started_at: float, thread: int) -> bool:
    """A stable batch handed to compute while ``span`` ran was delayed by it if it was
    queued behind it: its forward ran on the same ``thread`` and started (``started_at``,
    wall clock) only once that shadow forward had ended."""
    return (span is not None and span.end is not None and span.thread == thread
            and span.end <= started_at)
