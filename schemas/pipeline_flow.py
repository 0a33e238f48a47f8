"""How a request moves through a pipeline: pure functions over envelopes.

The caller's request ID carries the final result; each step runs as its own request,
``{id}:{step}``, on its model's lane, so its result is first-terminal-wins under
(request ID, step). :func:`advance` turns one step's terminal result into what comes
next: the successor steps' requests, or the caller's terminal result (the output step
succeeded, or any step failed, expired or was cancelled). It is called before the
step's own result is written (``workers.middleware.pipelines``), so a crash between the
two re-runs it on redelivery: every request and result it yields is keyed, and the
store keeps the first, so nothing enters twice (docs/pipelines.md, "Exactly once").
A join waits for all of its sources: each source's output is put in a per-(request,
join) hash (``connectors.pipelines``) and the put that completes it computes the join
(:func:`join_outputs`) and advances from there (:func:`after_join`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
        raise ValidationError(f"pipeline {pipeline.name!r}: {node.name!r} is a join, "
                              "not a step with a model")
    return Request(
        request_id=step_id(caller.request_id, node.name), model=node.model, inputs=inputs,
        lane=caller.lane, enqueued_at=caller.enqueued_at, deadline_at=caller.deadline_at,
        owner=caller.owner, version=node.version, routing_key=caller.routing_key,
        traceparent=caller.traceparent, cache=caller.cache, degrade=caller.degrade,
        pipeline=context(pipeline, caller, node.name, done))


def entry_requests(pipeline: Pipeline, caller: Request) -> list[Request]:
    """The first steps' requests for a caller's submit to the pipeline (several when
    the input fans out)."""
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


@dataclass(frozen=True, slots=True)
class JoinPart:
    """One source's output on its way into a join: put, then counted."""

    join: str
    source: str
    expected: int
    outputs: Any
    done: list[dict[str, Any]]


@dataclass(slots=True)
class Advance:
    """What one step's terminal result leads to."""

    requests: list[Request] = field(default_factory=list)
    final: Result | None = None
    joins: list[JoinPart] = field(default_factory=list)


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
        where = f"step {step!r} (model {result.model})"
        source = pipeline.node(step).sources[0] if step in _names(pipeline) else INPUT
        if err.type == "validation_error" and _step_of(source) != INPUT:
            # the first request across an edge whose ends had no declared specs
            where = f"edge {source} -> {step}: {where}"
        error = ErrorInfo(err.type, f"{where}: {err.message}", err.retryable)
        return Advance(final=_final(ctx, result, now, error=error, steps=done))
    successors = pipeline.successors(step)
    if not successors:
        return Advance(final=_final(ctx, result, now, steps=done))
    joins = [JoinPart(n.name, step, len({_step_of(x) for x in n.sources}), result.outputs, done)
             for n in successors if n.join is not None]
    caller = Request(
        request_id=str(ctx["id"]), model=pipeline.name, inputs=request.inputs, lane=request.lane,
        enqueued_at=float(ctx.get("enqueued_at") or request.enqueued_at),
        deadline_at=request.deadline_at, callback_url=ctx.get("callback_url"),
        notify=ctx.get("notify"), owner=ctx.get("owner"),
        routing_key=request.routing_key, traceparent=request.traceparent,
        cache=request.cache, notify_format=ctx.get("notify_format"), degrade=request.degrade)
    return Advance(requests=[
        step_request(pipeline, n, caller, _pick(result.outputs, n.sources[0], step), done)
        for n in successors if n.model is not None], joins=joins)


def after_join(pipeline: Pipeline, request: Request, join: str,
               parts: Mapping[str, tuple[Any, list[dict[str, Any]]]], now: float) -> Advance:
    """The join is complete (``parts``: source step -> its output and step records):
    combine, then advance from the join as from a step that answered it."""
    node = pipeline.node(join)
    arrays = [_pick(parts[_step_of(src)][0], src, _step_of(src)) for src in node.sources]
    started = time.time()
    outputs = join_outputs(node, arrays)
    records: dict[str, dict[str, Any]] = {}
    for source in dict.fromkeys(_step_of(src) for src in node.sources):
        for rec in parts[source][1]:
            records.setdefault(str(rec.get("step")), rec)
    ctx = dict(request.pipeline or {}, step=join, done=list(records.values()))
    joined = Request(request.request_id, request.model, outputs, request.lane,
                     request.enqueued_at, request.deadline_at, routing_key=request.routing_key,
                     traceparent=request.traceparent, cache=request.cache,
                     degrade=request.degrade, pipeline=ctx)
    result = Result(request.request_id, "succeeded", outputs, model=f"join:{node.join}",
                    attempts=1, started_at=started, finished_at=time.time(),
                    compute_ms=(time.time() - started) * 1000.0, queue_ms=0.0)
    return advance(pipeline, joined, result, now)


def join_outputs(node: Node, arrays: list[Any]) -> Any:
    """``concatenate``, ``stack`` or ``mean`` of the sources' outputs, in ``from`` order,
    or what a ``module:function`` returns given that list. A shape that does not fit is a
    ValidationError naming the join (the first request to cross it fails)."""
    try:
        if node.join == "mean":
            return np.mean(np.stack([np.asarray(a) for a in arrays]), axis=0).astype(
                np.asarray(arrays[0]).dtype)
        if node.join == "stack":
            return np.stack([np.asarray(a) for a in arrays])
        if node.join == "concatenate":
            return np.concatenate([np.asarray(a) for a in arrays])
        function = _function(str(node.join))
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"join {node.name} ({node.join}): {exc}") from exc
    try:
        return function(arrays)
    except Exception as exc:  # a user's join function: its failure fails the request
        raise ValidationError(f"join {node.name} ({node.join}): "
                              f"{type(exc).__name__}: {exc}") from exc


def _function(spec: str) -> Callable[[list[Any]], Any]:
    module, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValidationError(f"join function {spec!r} cannot be loaded: {exc}") from exc
    return found  # type: ignore[no-any-return]


def _names(pipeline: Pipeline) -> set[str]:
    return {n.name for n in pipeline.nodes}


def _step_of(source: str) -> str:
    return source.partition(".")[0]


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
