"""The latency scenario: open-loop Poisson arrivals at a fixed offered rate.

Arrival times are drawn up front (exponential gaps) and each arrival does one
``submit`` (the SDK's per-request path: two round trips), in its own task, so
a slow answer never delays the next arrival. Latency runs from the
*scheduled* arrival time to the moment the result is available at the client,
so if the client itself falls behind, that lag is charged to latency rather
than hidden (no coordinated omission). Results are collected by one
``as_completed`` over the pre-drawn request IDs, running concurrently.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfleet.bench.procstat import CpuMeter
from batchfleet.bench.samples import Sample, sample_of
from batchfleet.producers import AsyncClient
from batchfleet.producers.client import new_request_id

#: Submits in flight at once. Each in-flight submit holds one of the SDK's pooled
#: connections, and redis-py 8's asyncio pool raises "Too many connections" past 100
#: rather than waiting, so a client that falls behind would fail instead of queueing.
#: A submit held back here is still timed from its schedule.
MAX_CONCURRENT_SUBMITS = 64
#: Time for the collector to register its waiters before the first arrival.
_PRIME_S = 0.2
_DRAIN_TIMEOUT_S = 60.0


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator,
                     limit: int | None = None) -> np.ndarray[Any, Any]:
    """Arrival offsets (s) of a Poisson process of ``rate``/s over ``duration_s``."""
    expected = rate * duration_s
    gaps = rng.exponential(1.0 / rate, size=int(expected + 6 * np.sqrt(expected) + 16))
    times = np.cumsum(gaps)
    times = times[times < duration_s]
    return times[:limit] if limit is not None else times


@dataclass(frozen=True, slots=True)
class OpenLoopRun:
    offered_rps: float
    samples: list[Sample]
    arrivals: int
    wall_s: float
    #: How late submits started versus their schedule, and how long each submit took (ms).
    start_lag_ms: list[float]
    submit_ms: list[float]
    cpu_s: dict[str, float]

    @property
    def achieved_rps(self) -> float:
        return len(self.samples) / self.wall_s if self.wall_s > 0 else 0.0


async def open_loop(
    client: AsyncClient, model: str, inputs: np.ndarray[Any, Any], *, rate: float,
    duration_s: float, meter: CpuMeter, rng: np.random.Generator,
    max_requests: int | None = None, coalesce: bool = False,
) -> OpenLoopRun:
    """Offer ``rate`` requests/s for ``duration_s``.

    ``coalesce=False`` (the specified scenario) submits each arrival with its own
    ``submit`` call in its own task; the SDK may merge submits made in the same
    event-loop turn into one round trip, as it would for any concurrent caller.
    ``coalesce=True`` is a diagnostic: arrivals that fall due together (the loop wakes
    about once a millisecond) go out in one explicit ``submit_many``. Latency is timed
    per request from its own scheduled arrival either way, so comparing the two shows
    what the per-request ``submit`` path costs on top of the fleet itself.
    """
    offsets = poisson_arrivals(rate, duration_s, rng, max_requests)
    ids = [new_request_id() for _ in offsets]
    scheduled: dict[str, float] = {}
    samples: list[Sample] = []
    start_lag: list[float] = []
    submit_ms: list[float] = []

    async def collect() -> None:
        async for res in client.as_completed(ids, duration_s + _DRAIN_TIMEOUT_S):
            samples.append(sample_of(res, scheduled[res.request_id], time.time()))

    slots = asyncio.Semaphore(MAX_CONCURRENT_SUBMITS)

    async def submit(group: list[int], due: list[float]) -> None:
        async with slots:
            began = time.time()
            if coalesce:
                await client.submit_many(model, [inputs[i % len(inputs)] for i in group],
                                         request_ids=[ids[i] for i in group])
            else:
                await client.submit(model, inputs[group[0] % len(inputs)],
                                    request_id=ids[group[0]])
            took = (time.time() - began) * 1000.0
            start_lag.extend((began - d) * 1000.0 for d in due)
            submit_ms.extend([took] * len(group))

    collector = asyncio.create_task(collect())
    await asyncio.sleep(_PRIME_S + len(ids) / 200_000)
    submits: list[asyncio.Task[None]] = []
    first = meter.snapshot(time.time())
    t0 = first.wall
    due_at = [t0 + float(offset) for offset in offsets]
    i = 0
    while i < len(ids):
        delay = due_at[i] - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.time()
        group = [i]
        while coalesce and i + len(group) < len(ids) and due_at[i + len(group)] <= now:
            group.append(i + len(group))
        for j in group:
            scheduled[ids[j]] = due_at[j]
        submits.append(asyncio.create_task(submit(group, [due_at[j] for j in group])))
        i += len(group)
    await asyncio.gather(*submits)
    await collector
    last = meter.snapshot(max((s.done for s in samples), default=time.time()))
    return OpenLoopRun(rate, samples, len(ids), last.wall - t0, start_lag, submit_ms,
                       CpuMeter.usage(first, last))
