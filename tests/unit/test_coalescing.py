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


async def test_linger_holds_a_send_that_follows_one_too_closely() -> None:
    """With ``linger_s``, a submit right after a send waits out the rest of the linger,
    and what arrives meanwhile shares its send; one after a quiet spell goes at once."""
    sent: list[tuple[float, list[int]]] = []
    loop = asyncio.get_running_loop()

    async def send(items: list[int]) -> None:
        sent.append((loop.time(), items))

    coalescer: Coalescer[int] = Coalescer(send, chunk=100, linger_s=0.2)
    await coalescer.submit(0)
    later = []
    for i in range(1, 4):  # each in its own turn, all within the linger
        later.append(asyncio.create_task(coalescer.submit(i)))
        await asyncio.sleep(0.005)
    await asyncio.gather(*later)
    assert [items for _, items in sent] == [[0], [1, 2, 3]]
    assert sent[1][0] - sent[0][0] >= 0.2 - 0.005  # held until the linger ran out
    await asyncio.sleep(0.25)
    started = loop.time()
    await coalescer.submit(4)  # a quiet spell: not held back
    assert sent[-1][1] == [4] and sent[-1][0] - started < 0.2
