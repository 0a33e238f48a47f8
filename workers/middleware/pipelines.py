"""Pipeline hand-off: a step's terminal result enqueues the next step, or answers the caller.

The worker loop knows nothing of pipelines. A step is an ordinary request on its
model's lane whose envelope carries a ``pipeline`` key; this middleware's
``before_terminal`` hook sees its answer before the result is written and, through
``schemas.pipeline_flow.advance``, publishes the successor steps' requests or writes
the caller's terminal result (first-terminal-wins). Because that happens before the
step's own write, and the write before the ack, a crash anywhere re-runs the hand-off on
redelivery; every message and result it makes is keyed by (request ID, step), so the
store keeps one of each (docs/pipelines.md, "Exactly once").
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import structlog

from batchfleet.connectors.broker import OutboundMessage, Publisher
from batchfleet.connectors.control_plane import StoreResults
from batchfleet.connectors.pipelines import PipelineRegistry
from batchfleet.connectors.values import TerminalWrite
from batchfleet.schemas.envelopes import (
    ErrorInfo,
    Request,
    Result,
    decode_request,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import SchemaError
from batchfleet.schemas.pipeline import Pipeline
from batchfleet.schemas.pipeline_flow import Advance, advance, after_join, step_record
from batchfleet.schemas.tensors import decode_tensors, encode_tensors
from batchfleet.workers.jobs import Answer
from batchfleet.workers.middleware.base import Middleware

if TYPE_CHECKING:
    from batchfleet.workers.completion import Completed
    from batchfleet.workers.context import WorkerContext
    from batchfleet.workers.metrics import WorkerMetrics

log = structlog.get_logger("batchfleet.pipelines")

#: How long a pipeline's record is trusted before it is read again.
RECORD_TTL_S = 5.0


def step_of(answer: Answer) -> Request | None:
    """The step's request behind an answer, or None for an ordinary request. Step IDs
    always hold ``:``, so most answers are passed over without a decode."""
    if ":" not in answer.result.request_id or b"pipeline" not in answer.delivery.payload:
        return None
    try:
        request = decode_request(answer.delivery.payload)
    except SchemaError:
        return None  # answered as undecodable already: no context to follow
    return request if request.pipeline is not None else None


class PipelineAdvance(Middleware):
    """Hands each finished step on (see the module doc)."""

    def __init__(self, metrics: WorkerMetrics | None = None) -> None:
        self._metrics = metrics
        #: The webhook sink's ``enqueue`` (``--webhooks``): a caller's ``callback_url`` gets
        #: the pipeline's result, enqueued before that result is written, as for a model's.
        self.callbacks: Callable[[Sequence[Answer]], Awaitable[None]] | None = None
        #: step request ID -> (pipeline, step), from the hand-off to the write's outcome.
        self._labels: dict[str, tuple[str, str]] = {}
        self._publisher: Publisher | None = None
        self._store: StoreResults | None = None
        self._registry: PipelineRegistry | None = None
        self._records: dict[str, tuple[float, Pipeline | None]] = {}

    async def on_start(self, ctx: WorkerContext) -> None:
        self._publisher, self._store = ctx.publisher, ctx.store
        self._registry = ctx.plane.pipelines

    async def before_terminal(self, answers: Sequence[Answer]) -> None:
        steps = [(a, r) for a in answers if (r := step_of(a)) is not None]
        if not steps or self._publisher is None or self._store is None:
            return
        now = time.time()
        outbound: list[OutboundMessage] = []
        finals: list[tuple[Request, Result]] = []
        hooked: list[Answer] = []
        # A caller already terminal (cancelled, or ended by another step) goes no further:
        # one read per batch, so a cancel stops the pipeline at its next hop.
        callers = await self._store.get_records(
            [str((r.pipeline or {}).get("id")) for _, r in steps])
        for (answer, request), record in zip(steps, callers, strict=True):
            ctx = request.pipeline or {}
            self._labels[answer.result.request_id] = (str(ctx.get("name")), str(ctx.get("step")))
            if record is not None and record.status != "pending":
                continue
            nxt = await self._advance(request, answer.result, now)
            while True:
                try:
                    outbound += [OutboundMessage(r.model, r.lane, r.request_id,
                                                 encode_request(r), r.traceparent)
                                 for r in nxt.requests]
                except SchemaError as exc:  # an output no request can carry
                    nxt = Advance(final=_failed(request, str(ctx.get("step")), exc,
                                                list(ctx.get("done", [])), now))
                if nxt.final is not None:
                    finals.append((request, nxt.final))
                    if ctx.get("callback_url"):
                        hooked.append(Answer(answer.delivery, nxt.final, None, 0,
                                             str(ctx["callback_url"])))
                joined = await self._joins(request, nxt, now)
                if joined is None:
                    break
                nxt = joined
        if outbound:
            await self._publisher.publish(outbound)
        if finals:
            await self._keep(finals)
            if hooked and self.callbacks is not None:
                await self.callbacks(hooked)
            won = await self._store.write_terminal([_terminal(req, res) for req, res in finals])
            if self._metrics is not None:
                for (_, res), first in zip(finals, won, strict=True):
                    if first:
                        self._metrics.pipeline_results.labels(res.model, res.status).inc()

    def after_complete(self, done: Completed) -> None:
        """Count each step once, where its own write won (a redelivery's does not)."""
        if not self._labels:
            return
        for answer, first in zip(done.answers, done.won, strict=False):
            labels = self._labels.pop(answer.result.request_id, None)
            if labels is not None and first and self._metrics is not None:
                self._metrics.pipeline_steps.labels(*labels, answer.result.status).inc()
        if len(self._labels) > 100_000:  # answers refused and left for redelivery
            self._labels.clear()

    async def _keep(self, finals: Sequence[tuple[Request, Result]]) -> None:
        """``keep_intermediate_s``: the earlier steps' results (written by now; the last
        step's is written after this, for the result TTL) are kept that long."""
        if self._registry is None:
            return
        by_ttl: dict[int, list[str]] = {}
        for request, result in finals:
            pipeline = await self._pipeline(result.model)
            keep = int(pipeline.keep_intermediate_s) if pipeline is not None else 0
            if keep > 0:
                ctx = request.pipeline or {}
                by_ttl.setdefault(keep, []).extend(
                    f"{result.request_id}:{s['step']}" for s in (result.steps or [])[:-1]
                    if not str(s.get("model", "")).startswith("join:")
                    and s.get("step") != ctx.get("step"))
        for ttl, ids in by_ttl.items():
            await self._registry.keep(ids, ttl)

    async def _joins(self, request: Request, nxt: Advance, now: float) -> Advance | None:
        """Put this step's parts into its joins; what a completed join leads to (one at a
        time: the loop above follows it), or None."""
        if not nxt.joins or self._registry is None:
            return None
        ctx = request.pipeline or {}
        merged = Advance()
        for part in nxt.joins:
            body = msgpack.packb({"outputs": encode_tensors(part.outputs), "done": part.done},
                                 use_bin_type=True)
            parts = await self._registry.join(str(ctx.get("id")), part.join, part.source,
                                              body, part.expected)
            if parts is None:
                continue
            pipeline = await self._pipeline(str(ctx.get("name")))
            if pipeline is None:
                continue
            try:
                decoded = {src: _part(raw) for src, raw in parts.items()}
                done = after_join(pipeline, request, part.join, decoded, now)
            except SchemaError as exc:
                done = Advance(final=_failed(request, part.join, exc, part.done, now))
            merged.requests += done.requests
            merged.joins += done.joins
            merged.final = merged.final or done.final
        return merged if (merged.requests or merged.joins or merged.final) else None

    async def _advance(self, request: Request, result: Result, now: float) -> Advance:
        ctx = request.pipeline or {}
        name = str(ctx.get("name"))
        pipeline = await self._pipeline(name)
        try:
            if pipeline is None:
                raise SchemaError(f"pipeline {name!r} is no longer declared")
            return advance(pipeline, request, result, now)
        except SchemaError as exc:  # an edge that does not fit, a pipeline removed
            log.warning("pipeline step cannot be handed on", request_id=ctx.get("id"),
                        step=ctx.get("step"), error=str(exc))
            done = [*ctx.get("done", []), step_record(str(ctx.get("step")), result)]
            caller = _failed(request, str(ctx.get("step")), exc, done, now)
            return Advance(final=caller)

    async def _pipeline(self, name: str) -> Pipeline | None:
        cached = self._records.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[0] < RECORD_TTL_S:
            return cached[1]
        if self._registry is None:
            return None
        found = await self._registry.get(name)
        self._records[name] = (now, found)
        return found


def _part(raw: bytes) -> tuple[Any, list[dict[str, Any]]]:
    """A join's stored part; SchemaError for one that does not read (fails the request)."""
    try:
        obj = msgpack.unpackb(raw, raw=False)
        return decode_tensors(obj["outputs"]), list(obj.get("done") or [])
    except (ValueError, TypeError, KeyError, AttributeError,
            msgpack.UnpackException) as exc:
        raise SchemaError(f"a join's stored part is malformed: {exc}") from exc


def _failed(request: Request, step: str, exc: Exception, done: list[dict[str, Any]],
            now: float) -> Result:
    """The caller's failure when a step's output cannot be handed on (an edge that does
    not fit, a pipeline removed): named after that step, with the steps so far."""
    ctx = request.pipeline or {}
    return Result(str(ctx.get("id")), "failed",
                  error=ErrorInfo("validation_error", f"step {step!r}: {exc}"),
                  model=str(ctx.get("name")), enqueued_at=float(ctx.get("enqueued_at") or 0.0),
                  finished_at=now, owner=ctx.get("owner"), steps=done)


def _terminal(request: Request, result: Result) -> TerminalWrite:
    """The caller's result as a store write, announced as the caller asked at submit."""
    ctx = request.pipeline or {}
    return TerminalWrite(result.request_id, result.status, encode_result(result),
                         ctx.get("notify"), 0, ctx.get("notify_format"))
