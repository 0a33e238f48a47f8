"""Stopping on Python 3.11, where ``asyncio.wait_for`` drops a cancel that lands as its
inner call finishes: a worker's side loops and a client's result listener are gone when
their owner stops, even when a cancel is dropped, and a bounded wait keeps its cancel
(``connectors.cancelling``)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.workers.middleware import Middleware
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.models.handler import TorchModuleHandler
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

pytestmark = pytest.mark.unit


class DropsFirstCancel(Middleware):
    """A side loop that drops the first cancel it gets, as a 3.11 ``wait_for`` does."""

    def __init__(self) -> None:
        self.cancels = 0
        self.ended = False

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._loop()]

    async def _loop(self) -> None:
        try:
            while True:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    self.cancels += 1
                    if self.cancels > 1:
                        raise
        finally:
            self.ended = True


async def test_a_side_loop_that_drops_a_cancel_is_gone_when_the_worker_stops() -> None:
    url = f"memory://cancel-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False)
    handlers = {"m": TorchModuleHandler("m", torch.nn.Identity())}
    dropper = DropsFirstCancel()
    worker = Worker(settings, handlers,
                    middleware=[*default_middleware(settings, handlers), dropper])
    running = asyncio.create_task(worker.async_run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 30)
        worker.request_stop()
        await asyncio.wait_for(running, 30)
        assert dropper.ended and dropper.cancels == 2
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []
    finally:
        reset_memory(url)


async def test_cancel_until_done_cancels_again_until_the_task_ends() -> None:
    dropper = DropsFirstCancel()
    task = asyncio.create_task(dropper._loop())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(cancel_until_done([task]), 10)
    assert task.cancelled() and dropper.cancels == 2


async def test_a_closed_client_leaves_no_listener_behind() -> None:
    """Closed at random points of its listener's wait: nothing of it is left running."""
    url = f"memory://cancel-{uuid.uuid4().hex[:8]}"
    try:
        for _ in range(50):
            client = AsyncClient(url, check_model=False)
            await client.submit("m", [1.0, 2.0])  # starts the result listener
            await asyncio.sleep(0.001 * (_ % 5))
            await asyncio.wait_for(client.close(), 10)
        left = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []
    finally:
        reset_memory(url)


async def _cancel_as_it_finishes(wait: Any) -> asyncio.Task[Any]:
    """A task awaiting ``wait(future)``; the future is answered and the task cancelled in
    one turn of the loop: the cancel lands as the awaited call finishes."""
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(wait(future))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    future.set_result("answered")
    task.cancel()
    await asyncio.wait([task])
    return task


async def test_bounded_keeps_a_cancel_that_lands_as_the_call_finishes() -> None:
    kept = await _cancel_as_it_finishes(lambda f: bounded(f, 5.0))
    assert kept.cancelled()
    if sys.version_info < (3, 12):  # what every bounded wait did before: the cancel is lost
        dropped = await _cancel_as_it_finishes(lambda f: asyncio.wait_for(f, 5.0))
        assert not dropped.cancelled() and dropped.result() == "answered"


async def test_bounded_answers_times_out_and_may_be_unbounded() -> None:
    assert await bounded(asyncio.sleep(0, "done"), 1.0) == "done"
    assert await bounded(asyncio.sleep(0.01, "late but unbounded"), None) == "late but unbounded"
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await bounded(never, 0.05)
    assert never.cancelled()  # as wait_for would: what timed out is cancelled
