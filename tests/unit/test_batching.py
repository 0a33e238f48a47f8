from __future__ import annotations

import asyncio

import pytest

from batchfleet.workers.batching import (
    FixedWait,
    MicroBatcher,
    gather_pause_s,
    is_batch_ready,
    pick_ready,
    seconds_until_due,
)

pytestmark = pytest.mark.unit


def test_ready_on_size_or_on_oldest_deadline() -> None:
    assert is_batch_ready(8, oldest_arrival=10.0, now=10.0, max_size=8, max_wait_s=1.0)
    assert not is_batch_ready(7, oldest_arrival=10.0, now=10.5, max_size=8, max_wait_s=1.0)
    assert is_batch_ready(1, oldest_arrival=10.0, now=11.0, max_size=8, max_wait_s=1.0)
    assert not is_batch_ready(0, oldest_arrival=0.0, now=99.0, max_size=8, max_wait_s=1.0)


def test_seconds_until_due_counts_from_the_oldest() -> None:
    assert seconds_until_due(10.0, now=10.25, max_wait_s=1.0) == pytest.approx(0.75)
    assert seconds_until_due(10.0, now=12.0, max_wait_s=1.0) == 0.0


def test_pick_prefers_higher_priority_then_oldest_and_never_compares_keys() -> None:
    groups = {("bulk", None): (8, 1.0, 1), ("interactive", "x"): (8, 5.0, 0),
              (("nested",), 3): (2, 9.9, 0), "old": (8, 2.0, 0)}
    assert pick_ready(groups, now=10.0, max_size=8, max_wait_s=1.0) == "old"
    del groups["old"]
    assert pick_ready(groups, now=10.0, max_size=8, max_wait_s=1.0) == ("interactive", "x")
    assert pick_ready({"a": (1, 9.5, 0)}, now=10.0, max_size=8, max_wait_s=1.0) is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_full_group_is_taken_at_once_and_only_max_size() -> None:
    clock = FakeClock()
    batcher: MicroBatcher[str, int] = MicroBatcher(4, 1.0, clock)
    batcher.put(("a", i) for i in range(6))
    assert batcher.take_ready() == ("a", [0, 1, 2, 3])
    assert batcher.take_ready() is None  # two left, not due yet
    clock.now += 1.0
    assert batcher.take_ready() == ("a", [4, 5])
    assert len(batcher) == 0


def test_the_fixed_wait_is_the_default_close_policy_and_reads_no_origins() -> None:
    """One path for every policy: without one the batcher runs ``FixedWait``, which is due
    at the oldest arrival plus the wait, whatever the item's enqueue time says."""
    clock = FakeClock()
    batcher: MicroBatcher[str, int] = MicroBatcher(4, 1.0, clock, enqueued_at=lambda i: 1.0,
                                                   wall_clock=lambda: 1e9)
    assert isinstance(batcher.policy, FixedWait) and batcher.policy.max_wait_s == 1.0
    assert batcher.policy.due_at("a", 1, 100.0, 0.0, 100.5) == 101.0
    batcher.put([("a", 1)])
    assert batcher.take_ready() is None  # an hours-old enqueue time does not make it due
    assert batcher.seconds_until_next_due() == pytest.approx(1.0)
    clock.now += 1.0
    assert batcher.take_ready() == ("a", [1])


def test_shape_groups_never_mix() -> None:
    clock = FakeClock()
    batcher: MicroBatcher[str, int] = MicroBatcher(2, 1.0, clock)
    batcher.put([("shape-a", 1), ("shape-b", 2), ("shape-a", 3)])
    assert batcher.take_ready() == ("shape-a", [1, 3])
    assert batcher.take_ready(flush=True) == ("shape-b", [2])


async def test_next_batch_returns_on_deadline_with_real_time() -> None:
    batcher: MicroBatcher[str, int] = MicroBatcher(100, 0.05)
    batcher.put([("k", 1)])
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await batcher.next_batch() == ("k", [1])
    assert 0.04 <= loop.time() - start < 0.5


async def test_next_batch_returns_immediately_when_full() -> None:
    batcher: MicroBatcher[str, int] = MicroBatcher(3, 10.0)

    async def fill() -> None:
        await asyncio.sleep(0.01)
        batcher.put(("k", i) for i in range(3))

    filler = asyncio.create_task(fill())
    got = await asyncio.wait_for(batcher.next_batch(), 1.0)
    await filler
    assert got == ("k", [0, 1, 2])


async def test_stop_flushes_partial_groups_then_returns_none() -> None:
    batcher: MicroBatcher[str, int] = MicroBatcher(10, 60.0)
    stop = asyncio.Event()
    batcher.put([("k", 1)])
    stop.set()
    assert await batcher.next_batch(stop) == ("k", [1])
    assert await batcher.next_batch(stop) is None


def test_a_partial_fetch_pauses_briefly_to_gather_arrivals() -> None:
    assert gather_pause_s(0, 64, 0.005) == 0.0  # the empty fetch already blocked
    assert gather_pause_s(64, 64, 0.005) == 0.0  # full: more is waiting, fetch at once
    assert gather_pause_s(3, 64, 0.005) == pytest.approx(0.00125)  # a quarter of max_wait
    assert gather_pause_s(3, 64, 0.020) == pytest.approx(0.002)  # capped
    assert gather_pause_s(3, 64, 0.0) == 0.0  # max_wait 0: never hold anything back
