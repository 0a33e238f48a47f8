from __future__ import annotations

import asyncio

import pytest

from batchfleet.connectors.cancelling import cancel_until_done
from batchfleet.producers.bulk.window import Slots

pytestmark = pytest.mark.unit


async def test_a_task_that_drops_one_cancel_is_cancelled_again_until_it_ends() -> None:
    """What Python 3.11's wait_for does to a cancel that races its inner call."""
    forever = asyncio.Event()
    dropped = 0

    async def drops_the_first_cancel() -> None:
        nonlocal dropped
        try:
            await forever.wait()
        except asyncio.CancelledError:
            dropped += 1  # swallowed, as the racing wait_for does
        await forever.wait()

    task = asyncio.create_task(drops_the_first_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done([task]), 10)
    assert dropped == 1 and task.cancelled()


async def test_a_feeder_waiting_for_slots_ends_when_the_window_closes() -> None:
    slots = Slots(2)
    await slots.acquire(2)
    waiting = asyncio.create_task(slots.acquire(1))
    await asyncio.sleep(0)
    assert not waiting.done()
    slots.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(asyncio.CancelledError):
        await slots.acquire(1)  # and a later one never waits
    slots.release(1)
    await slots.acquire(1)  # a free slot is still handed out: close only ends waiting
