"""Retries with exponential backoff, the dead-letter queue and crash-loop quarantine.

:func:`decide` is the pure rule; :class:`RetryingFailurePolicy` carries it out:
a retryable failure is re-stamped with its next attempt and scheduled on the
due-time schedule (see ``connectors.retry_schedule`` for why a schedule), and
its delivery is then acked; an exhausted or quarantined one goes to its
model's DLQ with its error history *and* gets a terminal ``failed`` result.
Validation errors are never retried. :class:`RetryPump` moves due retries back
onto their lanes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import structlog

from connectors.broker import OutboundMessage, Publisher
from connectors.dead_letters import DeadLetter, DeadLetterQueue
from connectors.retry_schedule import RetrySchedule
from schemas.envelopes import ErrorInfo, decode_request_header, encode_request
from schemas.errors import BatchfleetError, DecodeError
from workers.backoff import compute_backoff
from workers.failures import Disposition
from workers.intake import Job, answer_without_compute

log = structlog.get_logger("batchfleet.retry")

#: Errors that skip retries and go straight to the DLQ.
CRASH_LOOP = "crash_loop"

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
    worth retrying (or crash-looped), directly if it never was (bad input)."""
    if error.type == CRASH_LOOP:
        return "dead_letter"
    if not error.retryable:
        return "fail"
    return "retry" if attempt < config.max_attempts else "dead_letter"


class RetryingFailurePolicy:
    def __init__(
        self,
        schedule: RetrySchedule,
        dlq: DeadLetterQueue,
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
        retries: list[tuple[float, bytes]] = []
        letters: list[DeadLetter] = []
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
                retries.append((now + delay, encode_request(nxt)))
                out.rescheduled.append(job.delivery)
                continue
            final = error
            if action == "dead_letter":
                out.dead_lettered.append((req.model, req.lane))
                letters.append(DeadLetter(req.request_id, req.model, job.delivery.payload,
                                          req.attempt, history, error.type, now))
                final = ErrorInfo(error.type, f"{error.message} (dead-lettered after attempt "
                                  f"{req.attempt}; see `batchfleet dlq show {req.request_id}`)",
                                  error.retryable)
            out.answers.append(answer_without_compute(job.delivery, req, "failed", final, now,
                                                      job.model_version))
        await self._schedule.add(retries)
        await self._dlq.add(letters)
        return out


class RetryPump:
    """Re-enqueues retries whose time has come, from any worker, in batches."""

    def __init__(self, schedule: RetrySchedule, publisher: Publisher, interval_s: float = 0.1,
                 batch: int = 500) -> None:
        self._schedule = schedule
        self._publisher = publisher
        self._interval_s = interval_s
        self._batch = batch

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
            try:
                moved = await self.pump_once()
            except BatchfleetError as exc:
                log.warning("retry pump failed; will try again", error=str(exc))
                moved = 0
            if moved < self._batch:
                try:
                    await asyncio.wait_for(stop.wait(), self._interval_s)
                except TimeoutError:
                    continue
