"""Degraded and fail-closed answers, built from a job and what answered it. Pure.

A degraded answer is ``succeeded`` with the marks (``degraded``, ``degraded_reason``,
``fallback``, ``degraded_error``); ``model_version`` names the version that computed
the outputs (``cache``, ``model:`` steps) and is ``""`` for ``rules`` and ``value``
(docs/wire-format.md §6.1). A request sent with ``degrade="never"`` gets a ``failed``
answer of type ``unavailable`` (retryable) naming the trigger instead.
"""

from __future__ import annotations

from typing import Any

from batchfleet.schemas.envelopes import DEGRADE_NEVER, ErrorInfo, Result
from batchfleet.schemas.errors import UnavailableError
from batchfleet.workers.jobs import Answer, Job

#: What ``degraded_error`` says when nothing failed yet (a breaker open, a deadline near).
TRIGGER_CAUSES = {
    "breaker": ErrorInfo("breaker_open", "the model's circuit breaker is open", True),
    "deadline": ErrorInfo("deadline_exceeded",
                          "the request would have missed its deadline waiting for the model",
                          False),
    "overload": ErrorInfo("overloaded", "the lane's backlog was past --shed-after-ms", True),
}


def refuses(job: Job) -> bool:
    """Did the caller ask to fail closed rather than take a fallback answer?"""
    return job.request.degrade == DEGRADE_NEVER


def degraded_answer(job: Job, outputs: Any, fallback: str, reason: str, cause: ErrorInfo,
                    now: float, *, model_version: str = "", started_at: float | None = None,
                    compute_ms: float | None = None) -> Answer:
    req = job.request
    result = Result(
        req.request_id, "succeeded", outputs, None, req.model, model_version, req.attempt,
        req.enqueued_at, started_at if started_at is not None else now, now,
        max(0.0, (now - req.enqueued_at) * 1000.0) if req.enqueued_at else None,
        compute_ms, None, req.generation, {}, req.owner,
        degraded=True, degraded_reason=reason, fallback=fallback, degraded_error=cause)
    return Answer(job.delivery, result, req.notify, req.generation, req.callback_url,
                  req.notify_format)


def unavailable(reason: str, cause: ErrorInfo) -> ErrorInfo:
    """The failure a ``degrade="never"`` request gets where it would have been degraded."""
    return ErrorInfo(UnavailableError.wire_type,
                     f"the model could not answer ({reason}: {cause.type}: {cause.message}) "
                     "and the request refused a fallback answer (degrade=never)"[:2000],
                     UnavailableError.retryable)


def unavailable_answer(job: Job, reason: str, cause: ErrorInfo, now: float) -> Answer:
    req = job.request
    result = Result(
        request_id=req.request_id, status="failed", error=unavailable(reason, cause),
        model=req.model, model_version=job.model_version, attempts=req.attempt,
        enqueued_at=req.enqueued_at, finished_at=now, generation=req.generation,
        queue_ms=max(0.0, (now - req.enqueued_at) * 1000.0) if req.enqueued_at else None,
        owner=req.owner)
    return Answer(job.delivery, result, req.notify, req.generation, req.callback_url,
                  req.notify_format)
