"""The throughput scenario: a closed loop that keeps the fleet saturated.

Several lanes each submit a chunk with ``submit_many`` and wait for all of it
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
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfleet.bench.procstat import CpuMeter, CpuSnapshot
from batchfleet.bench.samples import Sample, in_window, sample_of
from batchfleet.producers import AsyncClient

WAIT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ClosedLoopRun:
    samples: list[Sample]
    window_s: float
    submitted: int
    cpu_s: dict[str, float]

    @property
    def throughput_rps(self) -> float:
        return len(self.samples) / self.window_s if self.window_s > 0 else 0.0


class _Budget:
    """How many requests may still be submitted (None: unbounded), shared by the lanes."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def take(self, n: int) -> int:
        if self.left is None:
            return n
        n = min(n, self.left)
        self.left -= n
        return n


async def closed_loop(
    client: AsyncClient, model: str, inputs: np.ndarray[Any, Any], *, chunk: int, lanes: int,
    warmup_s: float, duration_s: float, meter: CpuMeter, max_requests: int | None = None,
) -> ClosedLoopRun:
    """Saturate ``model`` for ``warmup_s + duration_s``; measure the last ``duration_s``."""
    samples: list[Sample] = []
    budget = _Budget(max_requests)
    submitted = 0
    start = time.time()
    stop_at = start + warmup_s + duration_s

    async def lane(index: int) -> None:
        nonlocal submitted
        offset = (index * chunk) % len(inputs)
        while time.time() < stop_at:
            n = budget.take(chunk)
            if n == 0:
                return
            rows = np.take(inputs, range(offset, offset + n), axis=0, mode="wrap")
            offset = (offset + n * lanes) % len(inputs)
            sent = time.time()
            ids = await client.submit_many(model, rows)
            submitted += n
            async for res in client.as_completed(ids, WAIT_TIMEOUT_S):
                samples.append(sample_of(res, sent, time.time()))

    edges: list[CpuSnapshot] = []

    async def measure(work: asyncio.Future[Any]) -> None:
        # The window opens after the ramp-up and closes at the deadline, or when the
        # request cap runs the lanes dry, whichever comes first. A cap so small that the
        # lanes finish during the ramp-up leaves the whole run as the window.
        at_start = meter.snapshot(start)
        await asyncio.wait({work}, timeout=warmup_s)
        edges.append(at_start if work.done() else meter.snapshot(time.time()))
        await asyncio.wait({work}, timeout=max(0.0, stop_at - time.time()))
        edges.append(meter.snapshot(time.time() if not work.done() else _last(samples)))

    work = asyncio.gather(*(lane(i) for i in range(lanes)))
    await asyncio.gather(work, measure(work))
    first, last = edges
    window = in_window(samples, first.wall, last.wall)
    return ClosedLoopRun(window, last.wall - first.wall, submitted, CpuMeter.usage(first, last))


def _last(samples: list[Sample]) -> float:
    return max((s.done for s in samples), default=time.time())
