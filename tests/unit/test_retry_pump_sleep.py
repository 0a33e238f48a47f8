"""The retry pump sleeps until the schedule's next due time instead of polling, and is woken
when its own worker schedules a retry (``workers.retry.RetryPump``). On ``memory://``: the
claims are counted, not timed."""

from __future__ import annotations

import asyncio
import time
import types
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors.memory_broker import open_memory_broker
from batchfleet.connectors.memory_plane import open_memory_control_plane
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.connectors.values import Retry
from batchfleet.schemas.envelopes import ErrorInfo, Request, decode_request, encode_request
from batchfleet.schemas.names import Names
from batchfleet.workers.jobs import Disposition
from batchfleet.workers.middleware.fleet import RetryPumpLoop
from batchfleet.workers.retry import RetryPump, pump_pause_s

pytestmark = pytest.mark.unit
NAMES = Names("pump")
LIVENESS_S = 5.0


def test_the_pause_runs_to_the_next_due_time_between_the_floor_and_the_idle_cap() -> None:
    assert pump_pause_s(None, 100.0, 0.1, 1.0) == 1.0  # nothing scheduled
    assert pump_pause_s(100.4, 100.0, 0.1, 1.0) == pytest.approx(0.4)
    assert pump_pause_s(100.01, 100.0, 0.1, 1.0) == 0.1  # claims at most every floor
    assert pump_pause_s(99.0, 100.0, 0.1, 1.0) == 0.1  # one already due: the floor
    assert pump_pause_s(250.0, 100.0, 0.1, 1.0) == 1.0  # far off: others' are found by then


class CountingSchedule:
    """The memory schedule, counting claims and next-due reads."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.claims, self.reads = inner, 0, 0

    async def claim_due(self, now: float, limit: int = 500, lease_s: float = 30.0
                        ) -> list[bytes]:
        self.claims += 1
        return list(await self.inner.claim_due(now, limit, lease_s))

    async def next_due(self) -> float | None:
        self.reads += 1
        return await self.inner.next_due()  # type: ignore[no-any-return]

    async def done(self, envelopes: list[bytes]) -> None:
        await self.inner.done(envelopes)


@pytest.fixture
def url() -> Iterator[str]:
    url = f"memory://pump-{uuid.uuid4().hex[:8]}"
    yield url
    reset_memory(url)


def retry(request_id: str, due: float) -> Retry:
    req = Request(request_id, "m", np.zeros(2, np.float32))
    return Retry(due, encode_request(req), request_id, 0)


def ids(deliveries: list[Any]) -> list[str]:
    return [decode_request(d.payload).request_id for d in deliveries]


async def first_fetch(consumer: Any) -> list[Any]:
    """The first deliveries the consumer gets, or none within the liveness timeout."""
    deadline = time.monotonic() + LIVENESS_S
    while time.monotonic() < deadline:
        if got := await consumer.fetch(10, 0.05):
            return list(got)
    return []


async def until(check: Any) -> None:
    deadline = time.monotonic() + LIVENESS_S
    while not check():
        assert time.monotonic() < deadline, "not within the liveness timeout"
        await asyncio.sleep(0.005)


async def test_an_idle_pump_claims_once_then_sleeps(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES)
    schedule = CountingSchedule(plane.retry_schedule)
    pump = RetryPump(schedule, open_memory_broker(url, names=NAMES).publisher(),  # type: ignore[arg-type]
                     interval_s=0.001, idle_s=60.0)
    stop = asyncio.Event()
    task = asyncio.create_task(pump.run(stop))
    await asyncio.sleep(0.3)  # polling every 1 ms would have claimed hundreds of times
    assert (schedule.claims, schedule.reads) == (1, 1)
    stop.set()
    await task


async def test_a_retry_scheduled_elsewhere_is_claimed_at_its_due_time(url: str) -> None:
    """Nobody wakes the pump: it read the due time before sleeping, or finds it by idle_s."""
    plane = open_memory_control_plane(url, NAMES)
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w")
    await consumer.start(["m"])
    await plane.retry_schedule.add_live([retry("r1", time.time() + 0.05)])
    schedule = CountingSchedule(plane.retry_schedule)
    pump = RetryPump(schedule, broker.publisher(), interval_s=0.001, idle_s=60.0)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(pump.run(stop))
    got = await first_fetch(consumer)
    assert ids(got) == ["r1"] and await plane.retry_schedule.size() == 0
    # two claims (one more if the timer fired a hair early); polling would be about 50
    assert schedule.claims <= 3, "the pump polled instead of sleeping to the due time"
    stop.set()
    await task


async def test_the_worker_wakes_its_sleeping_pump_when_it_schedules_a_retry(url: str) -> None:
    """The middleware wraps the failure policy: a rescheduled retry makes the pump read the
    next due time again, so it is claimed then, not after the pump's 60 s idle sleep."""
    plane = open_memory_control_plane(url, NAMES)
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w")
    await consumer.start(["m"])
    stop = asyncio.Event()
    loop = RetryPumpLoop(idle_s=60.0)
    await loop.on_start(types.SimpleNamespace(  # type: ignore[arg-type]
        plane=plane, publisher=broker.publisher(), stopping=stop))

    class Rescheduling:
        async def on_failures(self, failed: Any) -> Disposition:
            await plane.retry_schedule.add_live([retry("r2", time.time())])
            return Disposition(rescheduled=[object()])  # type: ignore[list-item]

    policy = loop.failure_policy(Rescheduling())
    [run] = loop.background_tasks()
    task = asyncio.create_task(run)
    await asyncio.sleep(0.1)  # the pump claimed nothing and went to sleep for 60 s
    await policy.on_failures([(object(), ErrorInfo("model_error", "boom", True))])  # type: ignore[list-item]
    got = await first_fetch(consumer)
    assert ids(got) == ["r2"]
    stop.set()
    await task


async def test_a_policy_that_rescheduled_nothing_leaves_the_pump_asleep(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES)
    schedule = CountingSchedule(plane.retry_schedule)
    stop = asyncio.Event()
    loop = RetryPumpLoop(idle_s=60.0)
    await loop.on_start(types.SimpleNamespace(  # type: ignore[arg-type]
        plane=types.SimpleNamespace(retry_schedule=schedule),
        publisher=open_memory_broker(url, names=NAMES).publisher(), stopping=stop))

    class Failing:
        async def on_failures(self, failed: Any) -> Disposition:
            return Disposition()

    policy = loop.failure_policy(Failing())
    [run] = loop.background_tasks()
    task = asyncio.create_task(run)
    await until(lambda: schedule.reads == 1)
    await policy.on_failures([])
    await asyncio.sleep(0.1)
    assert (schedule.claims, schedule.reads) == (1, 1)
    stop.set()
    await task


async def test_a_retry_no_pump_was_told_of_is_found_by_the_idle_cap(url: str) -> None:
    """Scheduled while the pump slept on an empty schedule (by a worker that then died):
    the pump finds it when its idle sleep ends, without being woken."""
    plane = open_memory_control_plane(url, NAMES)
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w")
    await consumer.start(["m"])
    schedule = CountingSchedule(plane.retry_schedule)
    pump = RetryPump(schedule, broker.publisher(), interval_s=0.001, idle_s=0.3)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(pump.run(stop))
    await until(lambda: schedule.reads == 1)  # asleep, having seen nothing scheduled
    await plane.retry_schedule.add_live([retry("r3", time.time())])
    got = await first_fetch(consumer)
    assert ids(got) == ["r3"] and schedule.claims >= 2
    stop.set()
    await task
