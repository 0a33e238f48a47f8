"""How long a request has queued, for the ``overload`` trigger, on this worker's clock.

``enqueued_at`` is the producer's wall clock; comparing it with ours lets a skewed
producer shed everything (a clock behind ours) or hide an overload (a clock ahead). So a
request's age is measured as the batcher measures it (``batching.origin_of``): its
origin is fixed on arrival, on the monotonic clock, as the arrival less the time it had
already queued, and a producer clock ahead of ours counts as no queue time. A request
then ages on our clock alone from its arrival, whatever the producer's clock says. (An
``enqueued_at`` far in the past is indistinguishable from a request that truly waited
that long: the broker held it; such a request is old.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from batchfleet.workers.batching import origin_of
from batchfleet.workers.jobs import Job

#: Origins kept at most; past it the oldest are forgotten (a job that never reached a
#: batch: answered from the cache, expired, cancelled), and such a job's age is read
#: from its arrival at the batch.
MAX_KEPT: Final = 100_000


class Arrivals:
    """Each fetched job's origin (monotonic seconds), until its batch is judged."""

    def __init__(self) -> None:
        self._origins: dict[int, tuple[str, float]] = {}

    def note(self, jobs: Sequence[Job], mono_now: float | None = None,
             wall_now: float | None = None) -> None:
        mono = time.monotonic() if mono_now is None else mono_now
        wall = time.time() if wall_now is None else wall_now
        for job in jobs:
            self._origins[id(job.delivery)] = (
                job.request.request_id, origin_of(mono, job.request.enqueued_at, wall))
        if len(self._origins) > MAX_KEPT:
            for key in list(self._origins)[:len(self._origins) - MAX_KEPT // 2]:
                del self._origins[key]

    def ages_s(self, jobs: Sequence[Job], mono_now: float | None = None) -> list[float]:
        """Each job's seconds since its origin, and forget them (their batch is judged
        now); a job never noted (or forgotten) is as old as :func:`origin_of` says now."""
        mono = time.monotonic() if mono_now is None else mono_now
        wall = time.time()
        out = []
        for job in jobs:
            kept = self._origins.pop(id(job.delivery), None)
            if kept is None or kept[0] != job.request.request_id:
                kept = ("", origin_of(mono, job.request.enqueued_at, wall))
            out.append(mono - kept[1])
        return out
