"""The throughput scenario: a closed loop that keeps the fleet saturated.

The lanes run in the producer processes (``batchfleet.bench.load``), split
between them, so the load generator is never what saturates. Several lanes
each submit a chunk with ``submit_many`` and wait for all of it
with ``as_completed`` before sending the next, so a fixed number of requests
is always outstanding. That window is several batches deep, so the worker
always finds a full batch waiting; throughput is then what the fleet can do,
not what the client offers. Only results that arrive inside the measured
window count (ramp-up and drain are excluded), and CPU time of every process
is read at the window's edges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from batchfleet.bench.procstat import CpuMeter, CpuSnapshot
from batchfleet.bench.samples import Row, Sample, in_window, row_of
from batchfleet.producers import AsyncClient

WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ClosedLoopRun:
    samples: list[Sample]
    window_s: float
    submitted: int
    cpu_s: dict[str, float]
    #: CPU time (``time.process_time``) the load generators spent in the window, and the
    #: results they received in it: the client's CPU per request.
    client_cpu_s: float = 0.0
    client_requests: int = 0
    #: The worker's event loop apart from its other threads (``CpuMeter.thread_split``).
    worker_threads: dict[str, float] = field(default_factory=dict)

    @property
    def throughput_rps(self) -> float:
        return len(self.samples) / self.window_s if self.window_s > 0 else 0.0

    @property
    def client_cpu_us_per_request(self) -> float:
        n = self.client_requests or len(self.samples)
        return self.client_cpu_s / n * 1e6 if n else float("nan")


class Budget:
    """How many requests may still be submitted (None: unbounded), shared by the lanes."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def take(self, n: int) -> int:
        if self.left is None:
            return n
        n = min(n, self.left)
        self.left -= n
        return n


async def closed_lanes(
    client: AsyncClient, model: str, inputs: np.ndarray[Any, Any], *, chunk: int,
    lanes: Sequence[int], total_lanes: int, stop_at: float, budget: Budget,
) -> tuple[list[Row], int]:
    """Run ``lanes`` (indices out of ``total_lanes``) until wall time ``stop_at``; returns
    each answer's row (``samples.Row``) and how many requests were submitted.

    Each lane submits a chunk with ``submit_many`` and waits for all of it before the
    next; lanes start at different offsets of ``inputs`` so they do not send the same rows.
    """
    answered: list[Row] = []
    submitted = 0
    stages = client.record_stages()

    async def lane(index: int) -> None:
        nonlocal submitted
        offset = (index * chunk) % len(inputs)
        while time.time() < stop_at:
            n = budget.take(chunk)
            if n == 0:
                return
            rows = np.take(inputs, range(offset, offset + n), axis=0, mode="wrap")
            offset = (offset + n * total_lanes) % len(inputs)
            sent = time.time()
            ids = await client.submit_many(model, rows)
            submitted += n
            async for res in client.as_completed(ids, WAIT_TIMEOUT_S):
                answered.append(row_of(res, sent, time.time(), stages))

    await asyncio.gather(*(lane(i) for i in lanes))
    return answered, submitted


async def closed_loop(
    client: AsyncClient, model: str, inputs: np.ndarray[Any, Any], *, chunk: int, lanes: int,
    warmup_s: float, duration_s: float, meter: CpuMeter, max_requests: int | None = None,
) -> ClosedLoopRun:
    """The closed loop from this process (``bench --runtimes``); the fleet bench's measured
    runs use producer processes (``batchfleet.bench.load``)."""
    samples: list[Sample] = []
    counts: list[int] = []
    start = time.time()
    stop_at = start + warmup_s + duration_s
    edges: list[CpuSnapshot] = []
    cpu0 = time.process_time()

    async def run() -> None:
        got, sent = await closed_lanes(client, model, inputs, chunk=chunk, lanes=range(lanes),
                                       total_lanes=lanes, stop_at=stop_at,
                                       budget=Budget(max_requests))
        samples.extend(Sample(*row) for row in got)
        counts.append(sent)

    async def measure(work: asyncio.Future[Any]) -> None:
        # The window opens after the ramp-up and closes at the deadline, or when the
        # request cap runs the lanes dry, whichever comes first.
        at_start = meter.snapshot(start)
        await asyncio.wait({work}, timeout=warmup_s)
        edges.append(at_start if work.done() else meter.snapshot(time.time()))
        await asyncio.wait({work}, timeout=max(0.0, stop_at - time.time()))
        read = meter.snapshot(time.time())
        edges.append(read if not work.done() else replace(read, wall=_last(samples)))
        edges.append(read)

    work = asyncio.ensure_future(run())
    await asyncio.gather(work, measure(work))
    first, last, read = edges
    window = in_window(samples, first.wall, last.wall)
    return ClosedLoopRun(window, last.wall - first.wall, sum(counts),
                         CpuMeter.usage(first, last), time.process_time() - cpu0, len(window),
                         meter.thread_split(first, read, "worker"))


def _last(samples: list[Sample]) -> float:
    return max((s.done for s in samples), default=time.time())
