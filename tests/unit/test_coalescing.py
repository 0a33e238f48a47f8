from __future__ import annotations

import asyncio

import pytest

from batchfleet.producers.coalescing import Coalescer

pytestmark = pytest.mark.unit


async def test_concurrent_submits_share_one_send_in_chunks() -> None:
    sent: list[list[int]] = []

    async def send(items: list[int]) -> None:
        sent.append(items)

    coalescer: Coalescer[int] = Coalescer(send, chunk=4)
    await asyncio.gather(*(coalescer.submit(i) for i in range(10)))
    assert sent == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    await coalescer.submit(42)  # alone: sent on the next turn, not held back
    assert sent[-1] == [42]


async def test_a_failed_send_fails_every_waiter_of_that_chunk() -> None:
    async def send(items: list[int]) -> None:
        raise ConnectionError("store down")

    coalescer: Coalescer[int] = Coalescer(send, chunk=100)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_submits_arriving_during_busy_sends_go_out_together() -> None:
    """Group commit: with both send slots busy, later submits wait and share one send."""
    sent: list[list[int]] = []
    release = asyncio.Event()

    async def send(items: list[int]) -> None:
        sent.append(items)
        await release.wait()

    coalescer: Coalescer[int] = Coalescer(send, chunk=100, max_in_flight=2)
    first = [asyncio.create_task(coalescer.submit(i)) for i in (0, 1)]
    await asyncio.sleep(0)
    second = asyncio.create_task(coalescer.submit(2))  # a turn later: its own send
    await asyncio.sleep(0.01)
    later = []
    for i in range(3, 8):  # one at a time, each in its own event-loop turn
        later.append(asyncio.create_task(coalescer.submit(i)))
        await asyncio.sleep(0.001)
    assert sent == [[0, 1], [2]]  # both slots busy: 3..7 are held back
    release.set()
    await asyncio.gather(*first, second, *later)
    assert sent == [[0, 1], [2], [3, 4, 5, 6, 7]]
