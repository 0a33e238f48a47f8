from __future__ import annotations

import asyncio

import pytest

from batchfleet.producers.coalescing import (
    IDLE_LINGERS_TO_PAUSE,
    PROBE_EVERY,
    Coalescer,
    linger_verdict,
)

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


def test_linger_verdict_pauses_after_idle_lingers_and_resumes_on_one_that_gathers() -> None:
    assert linger_verdict(groups=1, idle=0) == (1, 0)  # one idle linger: keep lingering
    assert linger_verdict(groups=1, idle=IDLE_LINGERS_TO_PAUSE - 1) == (
        IDLE_LINGERS_TO_PAUSE, PROBE_EVERY)  # the second in a row: pause
    # a probe that gathers nothing pauses again at once, the count does not grow
    assert linger_verdict(groups=1, idle=IDLE_LINGERS_TO_PAUSE) == (
        IDLE_LINGERS_TO_PAUSE, PROBE_EVERY)
    assert linger_verdict(groups=2, idle=IDLE_LINGERS_TO_PAUSE) == (0, 0)
    assert linger_verdict(groups=0, idle=0) == (1, 0)  # a flush that found nothing left


async def test_a_caller_that_awaits_each_submit_is_not_held_by_the_linger() -> None:
    """A loop of awaited submits can never share a send: after two lingers that gathered
    nothing, its submits go at once, with one probe linger every ``PROBE_EVERY`` sends.
    Before, every submit after the first waited out the linger (39 of 40 here)."""
    sent: list[list[int]] = []

    async def send(items: list[int]) -> None:
        sent.append(items)

    coalescer: Coalescer[int] = Coalescer(send, chunk=100, linger_s=0.05)
    for i in range(40):
        await coalescer.submit(i)
    assert sent == [[i] for i in range(40)]
    # two idle lingers, then PROBE_EVERY sends at once, then one probe that gathered nothing
    assert coalescer.lingered == IDLE_LINGERS_TO_PAUSE + 1


async def test_lingering_resumes_when_a_probe_gathers_other_submits() -> None:
    sent: list[list[int]] = []

    async def send(items: list[int]) -> None:
        sent.append(items)

    coalescer: Coalescer[int] = Coalescer(send, chunk=100, linger_s=0.2)
    for i in range(1 + IDLE_LINGERS_TO_PAUSE + PROBE_EVERY):  # paused, then its sends spent
        await coalescer.submit(i)
    assert coalescer.lingered == IDLE_LINGERS_TO_PAUSE
    probe = asyncio.create_task(coalescer.submit(100))  # lingers: the probe
    await asyncio.sleep(0.005)
    others = [asyncio.create_task(coalescer.submit(101 + i)) for i in range(3)]
    await asyncio.gather(probe, *others)
    assert sent[-1] == [100, 101, 102, 103]  # the probe gathered the others
    assert coalescer.lingered == IDLE_LINGERS_TO_PAUSE + 1
    await coalescer.submit(200)  # lingering is back: this one waits out the linger too
    assert coalescer.lingered == IDLE_LINGERS_TO_PAUSE + 2
