"""Per-request cost of the batching path: ``MicroBatcher.put`` then ``take_ready`` until
empty, in process, no event loop work. Run ``python -m tests.support.batching_cost``;
it prints the median of several runs in ns of CPU per request (thread time: a shared
box that descheduled us does not count), for batch 64 and 512, with the
fixed wait and with a close policy that always says "due". Numbers: docs/performance.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from batchfleet.workers.batching import MicroBatcher

KEYS = 4  # a fetch's requests share a few keys (lane, model, shape, version)


class _DueNow:
    """A close policy that adds only its own calls: every group is due at once."""

    def due_at(self, key: Any, size: int, oldest_arrival: float, oldest_origin: float,
               now: float) -> float:
        return now

    def batch_size(self, key: Any, size: int, oldest_origin: float, now: float) -> int:
        return size

    def closed(self, key: Any, size: int, now: float) -> None:
        pass


def per_request_ns(batch: int, *, policy: bool, batches: int = 200, runs: int = 7) -> float:
    """Median over ``runs`` of (put + take of ``batches`` full batches) / requests."""
    keyed = [(i % KEYS, i) for i in range(batch * KEYS)]
    samples = []
    for _ in range(runs):
        mb: MicroBatcher[int, int] = MicroBatcher(
            batch, 0.0, policy=_DueNow() if policy else None,
            enqueued_at=(lambda item: 0.0) if policy else None)
        start = time.thread_time_ns()
        for _ in range(batches // KEYS):
            mb.put(keyed)
            while mb.take_ready() is not None:
                pass
        samples.append((time.thread_time_ns() - start) / (batches * batch))
    return statistics.median(samples)


def main() -> None:
    for batch in (64, 512):
        for policy in (False, True):
            name = "close policy" if policy else "fixed wait"
            print(f"batch {batch:4d}  {name:12s}  {per_request_ns(batch, policy=policy):7.1f} ns"
                  "/request", file=sys.stdout)


if __name__ == "__main__":
    main()
