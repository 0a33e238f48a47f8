"""What one worker did, counted: the final log line, the heartbeat and the tests read it."""

from __future__ import annotations

from dataclasses import dataclass

from batchfleet.workers.completion import Completed


@dataclass(slots=True)
class WorkerStats:
    """Counters of what this worker did; terminal counts only include writes that won."""

    batches: int = 0
    computed: int = 0
    succeeded: int = 0
    failed: int = 0
    expired: int = 0
    duplicates: int = 0
    #: Copies dropped, not run or retried: a replay superseded them, or they finished.
    stale: int = 0
    retried: int = 0
    dead_lettered: int = 0
    quarantined: int = 0
    undecodable: int = 0

    def count(self, done: Completed) -> None:
        self.retried += len(done.rescheduled)
        self.dead_lettered += len(done.dead_lettered)
        self.stale += len(done.superseded)
        for answer, first in zip(done.answers, done.won, strict=True):
            if not first:
                self.duplicates += 1
            elif answer.result.status == "succeeded":
                self.succeeded += 1
            elif answer.result.status == "expired":
                self.expired += 1
            else:
                self.failed += 1
