"""Worker spans, hung off each request's producer span through its ``traceparent``.

Registered (``defaults.py``) only when tracing is on, so a worker without ``OTEL_*``
pays nothing per request. Per traced request: *queue wait* (``enqueued_at`` until its
batch of deliveries is decoded here) and *result write* (its batch's compute end, or
decode for one that never ran, until it is acked or let go). Per batch: one *compute*
span linked to every traced request in it (a batch has many parents, so it starts a
trace of its own), current while the batch's hooks run, so their log lines carry its
IDs. Requests without a traceparent (raw producers, tracing off upstream) are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.tracing import format_traceparent, remote_context
from batchfleet.workers.intake import Intake
from batchfleet.workers.jobs import Answer
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext, Tracer


class Tracing(Middleware):
    def __init__(self, tracer: Tracer) -> None:
        from opentelemetry import context, trace

        self._tracer = tracer
        self._trace, self._context = trace, context
        #: id(delivery) -> (delivery, producer span, request ID, when its write began, ns).
        self._traced: dict[int, tuple[Delivery, SpanContext, str, int]] = {}
        #: id(batch) -> (compute span, context token), between before and after compute.
        self._computing: dict[int, tuple[Any, object]] = {}

    def _parent(self, ctx: SpanContext) -> Any:
        return self._trace.set_span_in_context(self._trace.NonRecordingSpan(ctx))

    async def after_decode(self, intake: Intake) -> None:
        now = time.time_ns()
        for job in intake.jobs:
            req = job.request
            ctx = remote_context(req.traceparent)
            if ctx is None:
                continue
            start = min(now, int(req.enqueued_at * 1e9)) if req.enqueued_at else now
            self._tracer.start_span(
                "batchfleet.queue_wait", context=self._parent(ctx),
                kind=self._trace.SpanKind.CONSUMER, start_time=start,
                attributes={"batchfleet.request_id": req.request_id,
                            "batchfleet.model": req.model, "batchfleet.lane": req.lane,
                            "batchfleet.attempt": req.attempt},
            ).end(end_time=now)
            self._traced[id(job.delivery)] = (job.delivery, ctx, req.request_id, now)

    async def before_compute(self, batch: Batch) -> bool:
        links = [self._trace.Link(entry[1]) for job in batch.jobs
                 if (entry := self._traced.get(id(job.delivery))) is not None]
        span = self._tracer.start_span(
            "batchfleet.compute", links=links,
            attributes={"batchfleet.model": batch.key.model,
                        "batchfleet.batch_size": len(batch.jobs)})
        token = self._context.attach(self._trace.set_span_in_context(span))
        self._computing[id(batch)] = (span, token)
        return True

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        entry = self._computing.pop(id(batch), None)
        if entry is None:
            return
        span, token = entry
        failed = sum(isinstance(o, BaseException) for o in run.outputs)
        span.set_attribute("batchfleet.forwards", run.forwards)
        span.set_attribute("batchfleet.failed", failed)
        self._context.detach(token)  # type: ignore[arg-type]
        span.end()
        now = time.time_ns()
        for job in batch.jobs:
            if (traced := self._traced.get(id(job.delivery))) is not None:
                self._traced[id(job.delivery)] = (*traced[:3], now)

    def traceparent_of(self, answer: Answer) -> str | None:
        """The producer's span of a traced answer: its webhook delivery span hangs off it."""
        traced = self._traced.get(id(answer.delivery))
        return None if traced is None else format_traceparent(traced[1])

    def release(self, deliveries: Sequence[Delivery]) -> None:
        now = time.time_ns()
        for delivery in deliveries:
            traced = self._traced.pop(id(delivery), None)
            if traced is None or traced[0] is not delivery:
                continue
            _, ctx, request_id, start = traced
            self._tracer.start_span(
                "batchfleet.result_write", context=self._parent(ctx), start_time=start,
                attributes={"batchfleet.request_id": request_id},
            ).end(end_time=max(start, now))
