"""What happens to a request whose compute failed: the failure policy seam.

The worker never decides this itself; it hands the failed jobs to a policy and
gets back a :class:`Disposition`: terminal answers to write (then ack),
deliveries the policy has re-enqueued itself (ack them now), and superseded
copies it dropped (ack them: a replay moved their request to a newer
generation, or it finished meanwhile; they are neither retried nor
dead-lettered). :class:`FailFast`
answers ``failed`` at once; ``workers.retry.RetryingFailurePolicy`` retries
with backoff and dead-letters.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.completion import answer_without_compute
from batchfleet.workers.jobs import Disposition, Job

__all__ = ["Disposition", "FailFast", "FailurePolicy"]


class FailurePolicy(Protocol):
    async def on_failures(self, failed: Sequence[tuple[Job, ErrorInfo]]) -> Disposition:
        """Answer or re-enqueue every failed job; raise a store error to be called again."""
        ...


class FailFast:
    """Every failure is terminal on its first attempt."""

    async def on_failures(self, failed: Sequence[tuple[Job, ErrorInfo]]) -> Disposition:
        now = time.time()
        return Disposition([
            answer_without_compute(job.delivery, job.request, "failed", error, now,
                                   job.model_version)
            for job, error in failed
        ])
