"""Timeouts of many waits on few timers (``producers/result_sink.py``, ``Alarms``) and
the compute thread's limit read from its own stamp (``workers/compute.py``,
``within_limit``): each bound fires no earlier than it says, and a cleared one never."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from batchfleet.producers.result_sink import Alarms, Sink
from batchfleet.workers.compute import within_limit

pytestmark = pytest.mark.unit


async def test_waits_due_in_one_tick_share_a_timer_and_time_out_no_sooner() -> None:
    loop = asyncio.get_running_loop()
    alarms = Alarms(tick_s=0.05)
    first, second = Sink(), Sink()
    began = loop.time()
    tick = alarms.set(loop, 0.02, first)
    assert alarms.set(loop, 0.02, second) == tick
    assert len(alarms) == 2
    assert len(alarms._due) == 1  # one timer for both
    while not (first.timed_out and second.timed_out):
        await asyncio.sleep(0.005)
        assert loop.time() - began < 5.0, "the alarm never rang"
    assert loop.time() - began >= 0.02
    assert len(alarms) == 0


async def test_a_cleared_wait_is_never_timed_out_and_its_timer_goes() -> None:
    loop = asyncio.get_running_loop()
    alarms = Alarms(tick_s=0.01)
    kept, cleared = Sink(), Sink()
    tick = alarms.set(loop, 0.03, cleared)
    alarms.clear(tick, cleared)
    assert len(alarms) == 0 and not alarms._due  # the last wait of a tick cancels its timer
    alarms.clear(tick, cleared)  # twice: nothing to do
    alarms.set(loop, 0.03, kept)
    await asyncio.sleep(0.1)
    assert kept.timed_out and not cleared.timed_out


async def test_a_forward_done_in_time_returns_its_result() -> None:
    loop = asyncio.get_running_loop()
    took: list[float] = []

    def quick() -> int:
        took.append(time.monotonic())
        return 7

    with ThreadPoolExecutor(1) as pool:
        assert await within_limit(loop.run_in_executor(pool, quick), took, 5.0) == 7


async def test_a_batch_no_thread_takes_times_out_and_stays_uncancelled() -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    took: list[float] = []
    with ThreadPoolExecutor(1) as pool:
        ahead = loop.run_in_executor(pool, release.wait)  # holds the only thread
        queued = loop.run_in_executor(pool, lambda: took.append(time.monotonic()))
        with pytest.raises(TimeoutError):
            await within_limit(queued, took, 0.1)
        assert not took and not queued.cancelled()
        release.set()
        await ahead
        await queued  # still the caller's: it runs once the thread is free


async def test_the_limit_counts_from_when_the_thread_took_the_batch() -> None:
    loop = asyncio.get_running_loop()
    took: list[float] = []

    def slow() -> str:
        took.append(time.monotonic())
        time.sleep(0.2)
        return "late"

    with ThreadPoolExecutor(1) as pool:
        ahead = loop.run_in_executor(pool, time.sleep, 0.4)  # queued behind this one
        future = loop.run_in_executor(pool, slow)
        # done 0.6 s after submit, past the limit, but 0.2 s after being taken: in time
        assert await within_limit(future, took, 0.5) == "late"
        await ahead
        took.clear()
        overrun = loop.run_in_executor(pool, slow)
        with pytest.raises(TimeoutError):
            await within_limit(overrun, took, 0.05)
        assert took and await overrun == "late"
