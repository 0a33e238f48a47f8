"""``SharedReads``: concurrent callers share one read per key; a cancelled caller leaves
it running for the rest; a failure reaches every caller; a finished read is not reused."""

from __future__ import annotations

import asyncio

import pytest

from batchfleet.producers.shared_reads import SharedReads


class _Reader:
    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def read(self) -> int:
        self.calls += 1
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.calls


async def test_concurrent_callers_share_one_read_per_key() -> None:
    reads: SharedReads[int] = SharedReads()
    reader, other = _Reader(), _Reader()
    waiting = [asyncio.ensure_future(reads.get("a", reader.read)) for _ in range(50)]
    elsewhere = asyncio.ensure_future(reads.get("b", other.read))
    await asyncio.sleep(0)
    assert reads.in_flight() == 2
    reader.release.set()
    other.release.set()
    assert await asyncio.gather(*waiting) == [1] * 50
    assert await elsewhere == 1
    assert (reader.calls, other.calls, reads.in_flight()) == (1, 1, 0)
    assert await reads.get("a", reader.read) == 2  # done: the next get reads again


async def test_a_cancelled_caller_leaves_the_read_to_the_others() -> None:
    reads: SharedReads[int] = SharedReads()
    reader = _Reader()
    first = asyncio.ensure_future(reads.get("a", reader.read))
    second = asyncio.ensure_future(reads.get("a", reader.read))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    reader.release.set()
    assert await second == 1 and first.cancelled() and reader.calls == 1


async def test_a_failed_read_fails_every_caller_and_is_not_kept() -> None:
    reads: SharedReads[int] = SharedReads()
    reader = _Reader()
    reader.fail = ConnectionError("registry down")
    waiting = [asyncio.ensure_future(reads.get("a", reader.read)) for _ in range(3)]
    await asyncio.sleep(0)
    reader.release.set()
    for outcome in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(outcome, ConnectionError)
    reader.fail = None
    assert await reads.get("a", reader.read) == 2 and reads.in_flight() == 0


async def test_every_caller_cancelled_still_retrieves_the_failure() -> None:
    reads: SharedReads[int] = SharedReads()
    reader = _Reader()
    reader.fail = ValueError("nobody is listening")
    lone = asyncio.ensure_future(reads.get("a", reader.read))
    await asyncio.sleep(0)
    lone.cancel()
    reader.release.set()
    with pytest.raises(asyncio.CancelledError):
        await lone
    for _ in range(3):
        await asyncio.sleep(0)
    assert reads.in_flight() == 0  # forgotten, its exception retrieved (no warning)
