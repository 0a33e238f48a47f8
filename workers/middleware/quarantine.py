"""Crash-loop quarantine and stale-copy drops as middleware.

Every redelivery is counted durably (one store call per fetched batch); on Kafka a
fetch's first deliveries are told apart first (``workers.log_positions``). A request
redelivered more often than it had attempts is a suspect: its worker died with
it, so it runs alone (noted durably before and after, so the count of its solo
runs survives the next death), and once it has killed ``quarantine_after``
workers running alone it is failed terminally. Copies whose request is already
terminal, or was replayed under a newer generation, are acked without running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.intake import Intake
from batchfleet.workers.jobs import Job
from batchfleet.workers.log_positions import tell_first_deliveries
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.retry import CRASH_LOOP
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.stats import WorkerStats

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")


class Quarantine(Middleware):
    def __init__(self, quarantine_after: int, stats: WorkerStats) -> None:
        self._after = quarantine_after
        self._stats = stats
        self._ctx: WorkerContext | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    async def after_decode(self, intake: Intake) -> None:
        """A delivery the broker vouches is the first of its message (a new Redis stream
        entry, a Kafka record above its log's claim) costs nothing, unless it is a retry
        or a replay: those are only read, for a stale generation. Redeliveries, and
        deliveries whose count is unknown, are counted."""
        assert self._ctx is not None
        ctx = self._ctx
        # Kafka's deliveries learn their count from their log's claim (one call a fetch)
        await tell_first_deliveries([j.delivery for j in intake.jobs], lambda claims: ctx.retrying(
            "claim log positions", ctx.store.claim_positions, claims))
        first = [j.delivery.delivery_count == 1 for j in intake.jobs]
        checked = [(j, f) for j, f in zip(intake.jobs, first, strict=True)
                   if not f or j.request.attempt > 1 or j.request.generation > 0]
        if not checked:
            return
        intake.jobs = [j for j, f in zip(intake.jobs, first, strict=True)
                       if f and j.request.attempt == 1 and j.request.generation == 0]
        # Before a redelivery the request had at least one delivery per attempt; on a
        # transport that skips counting first deliveries, this attempt's is uncounted.
        # A first delivery is only read (-1): its generation is what needs checking.
        before = [(j.request.request_id,
                   -1 if f else j.request.attempt - (j.delivery.delivery_count is None))
                  for j, f in checked]
        # Retried until it works: these deliveries are already fetched, and dropping them
        # would strand them (Kafka only redelivers after a rebalance).
        counts = await ctx.retrying("count deliveries", ctx.store.count_deliveries, before)
        for (job, only_read), (count, solo_runs, done_gen, gen) in zip(checked, counts,
                                                                      strict=True):
            if done_gen >= job.request.generation:
                intake.finished.append(job.delivery)  # only the ack was lost
                self._stats.duplicates += 1
            elif job.request.generation < gen:  # a replay superseded this copy: drop it
                intake.finished.append(job.delivery)
                self._stats.stale += 1
            elif only_read or solo_runs < self._after:
                job.solo = not only_read and count > job.request.attempt
                intake.jobs.append(job)
            else:
                log.error("request quarantined: its deliveries keep dying", deliveries=count,
                          request_id=job.request.request_id, attempt=job.request.attempt)
                self._stats.quarantined += 1
                intake.failed.append((job, ErrorInfo(
                    CRASH_LOOP, f"delivered {count} times without a result; the worker died "
                    f"each of the {solo_runs} times it ran alone (killed, out of memory or "
                    "crashed)", retryable=False)))

    async def before_compute(self, batch: Batch) -> bool:
        if batch.key.solo_request_id is not None:
            await self._mark_solo(batch.jobs[0], started=True)
        return True

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        if batch.key.solo_request_id is not None:
            await self._mark_solo(batch.jobs[0], started=False)

    async def on_dropped(self, batch: Batch) -> None:
        # marked as running alone, then not run after all: a solo run that never happened
        # must not count towards quarantine
        if batch.key.solo_request_id is not None and batch.jobs:
            await self._mark_solo(batch.jobs[0], started=False)

    async def _mark_solo(self, job: Job, started: bool) -> None:
        """Durably note a suspect's solo run before it starts, and undo it once it has run.
        Retried until the store answers: a suspect must never run uncounted."""
        assert self._ctx is not None
        store, req = self._ctx.store, job.request
        await self._ctx.retrying(
            "mark solo run",
            lambda flag: store.mark_solo(req.request_id, flag, req.attempt), started)
