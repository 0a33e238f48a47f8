"""Per-request log lines for what did not simply succeed, written once per batch."""

from __future__ import annotations

import itertools

import structlog

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.intake import Intake
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.runner import BatchRun

log = structlog.get_logger("batchfleet.worker")


class RequestLog(Middleware):
    def __init__(self) -> None:
        self._batch_ids = itertools.count(1)

    async def after_decode(self, intake: Intake) -> None:
        for answer in intake.answers:
            if answer.result.error is not None:
                log.info("request answered without compute", request_id=answer.result.request_id,
                         status=answer.result.status, error=answer.result.error.message)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        model, jobs = batch.key.model, batch.jobs
        log.debug("batch computed", batch_id=next(self._batch_ids), model=model,
                  size=len(jobs), compute_ms=round(run.compute_s * 1000, 3),
                  forwards=run.forwards, request_ids=[j.request.request_id for j in jobs])
        for job, output in zip(jobs, run.outputs, strict=True):
            if isinstance(output, BaseException):
                log.warning("request failed in model", request_id=job.request.request_id,
                            model=model, attempt=job.request.attempt,
                            error=ErrorInfo.from_exception(output).message)
