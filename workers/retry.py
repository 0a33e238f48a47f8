"""Retries with exponential backoff, the dead-letter queue and crash-loop quarantine.

:func:`decide` is the pure rule; :class:`RetryingFailurePolicy` carries it out:
a retryable failure is re-stamped with its next attempt and scheduled on the
due-time schedule (see ``connectors.retry_schedule`` for why a schedule), and
its delivery is then acked; an exhausted or quarantined one goes to its
model's DLQ with its error history *and* gets a terminal ``failed`` result.
Validation errors are never retried. A stale copy (its request was replayed
under a newer generation, or finished meanwhile) is neither retried nor
dead-lettered: both the schedule and the DLQ refuse it atomically, and its
delivery is acked as superseded. The DLQ keeps one letter per request ID and
generation, so a completion that runs twice dead-letters once.
:class:`RetryPump` moves due retries back onto their lanes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import structlog

from batchfleet.connectors.broker import OutboundMessage, Publisher
from batchfleet.connectors.control_plane import DeadLetters, RetrySchedule
from batchfleet.connectors.values import DeadLetter, Lettered, Retry
from batchfleet.schemas.envelopes import ErrorInfo, decode_request_header, encode_request
from batchfleet.schemas.errors import BatchfleetError, DecodeError, StalledError
from batchfleet.workers.aio import first_set
from batchfleet.workers.backoff import compute_backoff
from batchfleet.workers.completion import answer_without_compute
from batchfleet.workers.failures import Disposition
from batchfleet.workers.jobs import Job

if TYPE_CHECKING:
    from batchfleet.connectors.control_plane import ControlPlane
    from batchfleet.workers.settings import WorkerSettings

log = structlog.get_logger("batchfleet.retry")

#: Errors that skip retries and go straight to the DLQ.
CRASH_LOOP = "crash_loop"
#: A request that stalled compute twice (``workers.containment``): also straight to the DLQ.
STALLED = StalledError.wire_type

Action = Literal["retry", "dead_letter", "fail"]


@dataclass(frozen=True, slots=True)
class RetryConfig:
    max_attempts: int = 3
    base_s: float = 0.5
    cap_s: float = 30.0

    @classmethod
    def parse(cls, spec: str, default: RetryConfig) -> RetryConfig:
        """``ATTEMPTS[:BASE_S[:CAP_S]]``, e.g. ``5:0.2:10``."""
        parts = spec.split(":")
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"retry spec {spec!r} must be ATTEMPTS[:BASE_S[:CAP_S]]")
        attempts = int(parts[0])
        base = float(parts[1]) if len(parts) > 1 else default.base_s
        cap = float(parts[2]) if len(parts) > 2 else default.cap_s
        if attempts < 1 or base <= 0 or cap < base:
            raise ValueError(f"retry spec {spec!r}: need ATTEMPTS >= 1 and 0 < BASE <= CAP")
        return cls(attempts, base, cap)


def decide(error: ErrorInfo, attempt: int, config: RetryConfig) -> Action:
    """Retry a retryable error while attempts remain; otherwise fail, via the DLQ if it was
    worth retrying (or crash-looped, or stalled twice), directly if it never was (bad input)."""
    if error.type in (CRASH_LOOP, STALLED):
        return "dead_letter"
    if not error.retryable:
        return "fail"
    return "retry" if attempt < config.max_attempts else "dead_letter"


class RetryingFailurePolicy:
    def __init__(
        self,
        schedule: RetrySchedule,
        dlq: DeadLetters,
        default: RetryConfig = RetryConfig(),
        per_model: Mapping[str, RetryConfig] | None = None,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._schedule = schedule
        self._dlq = dlq
        self._default = default
        self._per_model = dict(per_model or {})
        self._rand = rand
        self._clock = clock

    def config_for(self, model: str) -> RetryConfig:
        return self._per_model.get(model, self._default)

    async def on_failures(self, failed: Sequence[tuple[Job, ErrorInfo]]) -> Disposition:
        now = self._clock()
        out = Disposition()
        retries: list[tuple[Job, Retry]] = []
        letters: list[tuple[Job, DeadLetter, ErrorInfo]] = []
        fails: list[tuple[Job, ErrorInfo]] = []
        for job, error in failed:
            req = job.request
            cfg = self.config_for(req.model)
            history = [*req.history, {"attempt": req.attempt, "type": error.type,
                                      "message": error.message, "at": now}]
            action = decide(error, req.attempt, cfg)
            if action == "retry":
                delay = compute_backoff(req.attempt, base_s=cfg.base_s, cap_s=cfg.cap_s,
                                        rand=self._rand)
                nxt = replace(req, attempt=req.attempt + 1, history=history)
                retries.append((job, Retry(now + delay, encode_request(nxt), req.request_id,
                                           req.generation)))
            elif action == "dead_letter":
                letters.append((job, DeadLetter(
                    req.request_id, req.model, job.delivery.payload, req.attempt, history,
                    error.type, now, generation=req.generation), error))
            else:
                fails.append((job, error))
        scheduled = await self._schedule.add_live([r for _, r in retries])
        for (job, _), ok in zip(retries, scheduled, strict=True):
            (out.rescheduled if ok else out.superseded).append(job.delivery)
        lettered = await self._dlq.add([dl for _, dl, _ in letters])
        for (job, dl, error), how in zip(letters, lettered, strict=True):
            if how is Lettered.STALE:
                out.superseded.append(job.delivery)
                continue
            if how is Lettered.ADDED:
                out.dead_lettered.append((dl.model, job.request.lane))
            # KNOWN still answers: an earlier run may have lettered it and died before
            # its failed result was written (the write is refused if it was).
            fails.append((job, ErrorInfo(
                error.type, f"{error.message} (dead-lettered after attempt {dl.attempts}; "
                f"see `batchfleet dlq show {dl.request_id}`)", error.retryable)))
        out.answers = [answer_without_compute(job.delivery, job.request, "failed", error, now,
                                              job.model_version)
                       for job, error in fails]
        return out


#: Longest an idle pump sleeps: how late a retry that no pump was told about (scheduled by
#: a worker that died, or by another worker whose own pump is busy) can come back.
IDLE_PUMP_S = 1.0


def pump_pause_s(next_due: float | None, now: float, floor_s: float, idle_s: float) -> float:
    """How long the pump sleeps after a claim that left nothing due: until the schedule's
    next due time, at least ``floor_s`` (claims at most that often, however the due times
    spread) and at most ``idle_s`` (retries other workers schedule are found by then)."""
    if next_due is None:
        return idle_s
    return min(max(next_due - now, floor_s), idle_s)


class RetryPump:
    """Re-enqueues retries whose time has come, from any worker, in batches.

    It sleeps until the schedule's next due time rather than polling: an idle worker
    claimed ten times a second, a Lua script each time (docs/performance.md, "An idle
    worker's retry pump"). :meth:`scheduled` wakes it when this worker schedules a retry,
    so that one is claimed on time; one scheduled elsewhere waits at most ``idle_s``.
    ``interval_s`` is the least time between two claims, however the due times spread."""

    def __init__(self, schedule: RetrySchedule, publisher: Publisher, interval_s: float = 0.1,
                 batch: int = 500, idle_s: float = IDLE_PUMP_S) -> None:
        self._schedule = schedule
        self._publisher = publisher
        self._interval_s = interval_s
        self._idle_s = idle_s
        self._batch = batch
        self._woken = asyncio.Event()

    def scheduled(self) -> None:
        """This worker just scheduled retries: read the next due time again."""
        self._woken.set()

    async def pump_once(self) -> int:
        claimed = await self._schedule.claim_due(time.time(), self._batch)
        if not claimed:
            return 0
        messages = []
        for envelope in claimed:
            try:
                header = decode_request_header(envelope)
            except DecodeError:  # cannot happen for envelopes we encoded; keep it visible
                log.error("unreadable envelope in the retry schedule", raw_bytes=len(envelope))
                continue
            lane = header.raw.get("lane", "interactive")
            messages.append(OutboundMessage(header.model, str(lane), header.request_id,
                                            envelope))
        await self._publisher.publish(messages)
        await self._schedule.done(claimed)
        return len(claimed)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            claimed_at = time.time()
            try:
                moved = await self.pump_once()
            except BatchfleetError as exc:
                log.warning("retry pump failed; will try again", error=str(exc))
                moved = 0
            if moved < self._batch:
                await self._sleep(stop, claimed_at)

    async def _sleep(self, stop: asyncio.Event, claimed_at: float) -> None:
        """Until the next due time (read again whenever this worker schedules a retry), or
        until ``stop``."""
        while not stop.is_set():
            self._woken.clear()  # before the read: a retry scheduled after it wakes the wait
            try:
                due = await self._schedule.next_due()
            except BatchfleetError:
                due = None  # the next claim reports the error; it comes within ``idle_s``
            left = claimed_at + pump_pause_s(due, claimed_at, self._interval_s,
                                             self._idle_s) - time.time()
            if left <= 0 or await first_set((stop, self._woken), left) is not self._woken:
                return


def default_policy(settings: WorkerSettings, plane: ControlPlane) -> RetryingFailurePolicy:
    """The failure policy the settings describe: retries with backoff, then the DLQ."""
    s = settings
    default = RetryConfig(s.max_attempts, s.retry_base_s, s.retry_cap_s)
    # the settings resolve each model's spec (``retry_for``): the text is read in one place
    per_model = {m: s.retry_for(m) for m, _ in s.retry_overrides}
    return RetryingFailurePolicy(plane.retry_schedule, plane.dead_letters, default, per_model)
