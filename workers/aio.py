"""Small asyncio helpers the worker's loops share."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from batchfleet.connectors.cancelling import bounded, cancel_until_done

T = TypeVar("T")


async def unless_stopped(stop: asyncio.Event, work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` unless ``stop`` is set first; then cancel it and return None."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    await cancel_until_done([task])
    return None


async def within(check: Awaitable[bool], timeout_s: float) -> bool:
    """A health check that hangs is a failed one."""
    try:
        return await bounded(check, timeout_s)
    except TimeoutError:
        return False


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    try:
        await bounded(event.wait(), timeout_s)
    except TimeoutError:
        return


async def first_set(events: tuple[asyncio.Event, ...], timeout_s: float
                    ) -> asyncio.Event | None:
    """The first of ``events`` to be set within ``timeout_s``, or None."""
    waits = {asyncio.ensure_future(e.wait()): e for e in events}
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return next((waits[w] for w in done), None)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the ``worker`` extra brings it): its loop and
    transports cost less per socket read than asyncio's, on the hot path's every fetch
    and write. None (asyncio's own loop) otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_until_signalled(main: Callable[[], Coroutine[Any, Any, None]],
                        on_signal: Callable[[], None]) -> None:
    """Run ``main()`` on a fresh loop (uvloop where installed), calling ``on_signal`` on
    SIGTERM and SIGINT."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await main()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run())


class BoundedTasks:
    """Tasks run at most ``limit`` at a time: ``spawn`` waits for a free slot, which is how
    slow writes push back on whoever spawns them."""

    def __init__(self, limit: int,
                 on_error: Callable[[BaseException], None] = lambda exc: None) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._on_error = on_error
        self.tasks: set[asyncio.Task[None]] = set()

    async def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await self._slots.acquire()
        except BaseException:
            work.close()  # never started
            raise
        task = asyncio.create_task(self._run(work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception as exc:  # handed to the owner, never left for the GC to report
            self._on_error(exc)
        finally:
            self._slots.release()

    async def drain(self) -> None:
        """Wait for every task, those spawned meanwhile included; errors are theirs."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
