"""How a request moves through a pipeline: pure functions over envelopes.

The caller's request ID carries the final result; each step runs as its own request,
``{id}:{step}``, on its model's lane, so its result is first-terminal-wins under
(request ID, step). :func:`advance` turns one step's terminal result into what comes
next: the successor steps' requests, or the caller's terminal result (the output step
succeeded, or any step failed, expired or was cancelled). It is called before the
step's own result is written (``workers.middleware.pipelines``), so a crash between the
two re-runs it on redelivery: every request and result it yields is keyed, and the
store keeps the first, so nothing enters twice (docs/pipelines.md, "Exactly once").
Joins are not in this version; a pipeline with one is refused at submit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchfleet.schemas.envelopes import ErrorInfo, Request, Result
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.pipeline import INPUT, Node, Pipeline
from batchfleet.schemas.validation import check_request_id


def step_id(request_id: str, step: str) -> str:
    """The request ID a step runs under (valid request-ID characters: ``:`` joins)."""
    return check_request_id(f"{request_id}:{step}")


def context(pipeline: Pipeline, request: Request, step: str,
            done: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``pipeline`` key of a step's envelope, from the caller's request: what the
    caller's terminal result needs (who to notify, how, who owns it)."""
    return {"name": pipeline.name, "id": request.request_id, "step": step,
            "notify": request.notify, "notify_format": request.notify_format,
            "callback_url": request.callback_url, "owner": request.owner,
            "enqueued_at": request.enqueued_at, "done": list(done or [])}


def step_request(pipeline: Pipeline, node: Node, caller: Request, inputs: Any,
                 done: list[dict[str, Any]] | None = None) -> Request:
    """A step's request: the caller's deadline, lane and degrade choice carry through;
    the step's own announcements and webhooks are off (the caller's come at the end)."""
    if node.model is None:
        raise ValidationError(f"pipeline {pipeline.name!r}: joins are not supported yet "
                              f"(step {node.name!r})")
    return Request(
        request_id=step_id(caller.request_id, node.name), model=node.model, inputs=inputs,
        lane=caller.lane, enqueued_at=caller.enqueued_at, deadline_at=caller.deadline_at,
        owner=caller.owner, version=node.version, routing_key=caller.routing_key,
        traceparent=caller.traceparent, cache=caller.cache, degrade=caller.degrade,
        pipeline=context(pipeline, caller, node.name, done))


def entry_requests(pipeline: Pipeline, caller: Request) -> list[Request]:
    """The first steps' requests for a caller's submit to the pipeline."""
    if any(n.join is not None for n in pipeline.nodes):
        raise ValidationError(f"pipeline {pipeline.name!r} has a join: joins are not "
                              "supported yet")
    return [step_request(pipeline, n, caller, _pick(caller.inputs, n.sources[0], INPUT))
            for n in pipeline.entry]


def step_record(step: str, result: Result) -> dict[str, Any]:
    """One entry of a pipeline result's ``steps``."""
    record: dict[str, Any] = {
        "step": step, "model": result.model, "model_version": result.model_version,
        "status": result.status, "queue_ms": result.queue_ms,
        "compute_ms": result.compute_ms, "attempts": result.attempts}
    if result.degraded:
        record["degraded"] = True
        record["fallback"] = result.fallback
    return record


@dataclass(slots=True)
class Advance:
    """What one step's terminal result leads to."""

    requests: list[Request] = field(default_factory=list)
    final: Result | None = None


def advance(pipeline: Pipeline, request: Request, result: Result, now: float) -> Advance:
    """The successors' requests, or the caller's result. ``request`` is the step's own
    (its ``pipeline`` context set), ``result`` its terminal result."""
    ctx = request.pipeline
    if ctx is None:
        raise ValidationError(f"request {request.request_id} is no pipeline step")
    step = str(ctx["step"])
    done = [*ctx.get("done", []), step_record(step, result)]
    if result.status != "succeeded":
        err = result.error or ErrorInfo("internal_error", "the step ended without an error")
        error = ErrorInfo(err.type, f"step {step!r} (model {result.model}): {err.message}",
                          err.retryable)
        return Advance(final=_final(ctx, result, now, error=error, steps=done))
    successors = pipeline.successors(step)
    if not successors:
        return Advance(final=_final(ctx, result, now, steps=done))
    caller = Request(
        request_id=str(ctx["id"]), model=pipeline.name, inputs=request.inputs, lane=request.lane,
        enqueued_at=float(ctx.get("enqueued_at") or request.enqueued_at),
        deadline_at=request.deadline_at, callback_url=ctx.get("callback_url"),
        notify=ctx.get("notify"), owner=ctx.get("owner"),
        routing_key=request.routing_key, traceparent=request.traceparent,
        cache=request.cache, notify_format=ctx.get("notify_format"), degrade=request.degrade)
    return Advance(requests=[
        step_request(pipeline, n, caller, _pick(result.outputs, n.sources[0], step), done)
        for n in successors])


def _final(ctx: dict[str, Any], result: Result, now: float, *,
           error: ErrorInfo | None = None, steps: list[dict[str, Any]]) -> Result:
    """The caller's terminal result: the last step's output (or the failure), timed from
    the caller's submit, with every step's record."""
    enqueued = float(ctx.get("enqueued_at") or 0.0)
    compute = sum(float(s.get("compute_ms") or 0.0) for s in steps)
    total = max(0.0, (now - enqueued) * 1000.0) if enqueued else None
    return Result(
        request_id=str(ctx["id"]), status=result.status,
        outputs=result.outputs if error is None else None, error=error,
        model=str(ctx["name"]), model_version=result.model_version,
        attempts=max((int(s.get("attempts") or 0) for s in steps), default=0),
        enqueued_at=enqueued, started_at=result.started_at, finished_at=now,
        queue_ms=None if total is None else max(0.0, total - compute), compute_ms=compute,
        batch_size=result.batch_size, owner=ctx.get("owner"),
        degraded=any(s.get("degraded") for s in steps),
        degraded_reason=result.degraded_reason, fallback=result.fallback,
        degraded_error=result.degraded_error, steps=steps)


def _pick(outputs: Any, source: str, owner: str) -> Any:
    """The tensor an edge carries: a step's whole output, or one named tensor of it."""
    _, dot, name = source.partition(".")
    if not dot:
        return outputs
    if not isinstance(outputs, dict) or name not in outputs:
        raise ValidationError(f"edge {source}: {owner} has no output named {name!r}")
    return outputs[name]
