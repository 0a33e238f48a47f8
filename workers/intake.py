"""Turning a fetched batch of deliveries into jobs, or into answers that need no compute.

Everything that can be decided before the model runs is decided here, for a
whole batch at once: broken bytes, wrong dtype or shape, an unknown model and
a passed deadline, and input outside the model's domain (its handler's
``validate`` hook). Each becomes a terminal answer that explains it; only
valid, live requests go on to the batcher.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.values import Undecodable
from batchfleet.schemas.batch_decode import decode_common
from batchfleet.schemas.envelopes import (
    DEFAULT_LIMITS,
    ErrorInfo,
    Limits,
    Request,
    Result,
    decode_request_header,
    lua_exact_generation,
    notify_format_of,
    request_from_header,
)
from batchfleet.schemas.errors import DecodeError, SchemaError, UnknownModelError, ValidationError
from batchfleet.schemas.tensors import Tensors
from batchfleet.schemas.validation import check_notify
from batchfleet.workers.models.handler import (
    ModelHandler,
    call_validate_hook,
    check_inputs,
    validate_hook,
    validate_request,
)
from batchfleet.workers.runner import BatchRun

EXPIRED = ErrorInfo("deadline_exceeded", "the request's deadline passed before it was computed")


@dataclass(slots=True)
class Job:
    """A valid request waiting for compute, with the delivery it must ack."""

    delivery: Delivery
    request: Request
    #: Set once computed, so even a failure's result names the model version that failed.
    model_version: str = ""
    #: A suspect (redelivered after its worker died): it runs in a batch of its own.
    solo: bool = False
    #: The version label routing chose ("": the model's first version on this worker).
    version: str = ""


@dataclass(slots=True)
class Answer:
    """A terminal result for a delivery, ready to be written and acked."""

    delivery: Delivery
    result: Result
    notify: str | None = None
    generation: int = 0
    #: Where the caller wants the terminal result delivered (a webhook), if anywhere.
    callback_url: str | None = None
    #: How the announcement on ``notify``'s channel is framed (``Request.notify_format``).
    notify_format: str | None = None


@dataclass(slots=True)
class Intake:
    jobs: list[Job] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    undecodable: list[tuple[Delivery, Undecodable]] = field(default_factory=list)
    #: Jobs a middleware refused to run, with the terminal error the failure policy settles.
    failed: list[tuple[Job, ErrorInfo]] = field(default_factory=list)
    #: Deliveries to ack without a result: already terminal, or superseded by a replay.
    finished: list[Delivery] = field(default_factory=list)


def answer_without_compute(
    delivery: Delivery, request: Request, status: str, error: ErrorInfo, now: float,
    model_version: str = "",
) -> Answer:
    result = Result(
        request_id=request.request_id, status=status,  # type: ignore[arg-type]
        error=error, model=request.model, model_version=model_version, attempts=request.attempt,
        enqueued_at=request.enqueued_at, finished_at=now, generation=request.generation,
        queue_ms=max(0.0, (now - request.enqueued_at) * 1000.0) if request.enqueued_at else None,
        owner=request.owner,
    )
    return Answer(delivery, result, request.notify, request.generation, request.callback_url,
                  request.notify_format)


def decode_deliveries(
    deliveries: Sequence[Delivery],
    handlers: Mapping[str, ModelHandler],
    limits: Limits = DEFAULT_LIMITS,
    now: float | None = None,
) -> Intake:
    """Decode a fetch in one pass (``schemas.batch_decode``); a delivery off its common
    path, or refused after it, goes through the single-request path, which says why."""
    now = time.time() if now is None else now
    out = Intake()
    checked: set[tuple[Any, ...]] = set()
    hooks: dict[str, Callable[[Tensors], object] | None] = {}
    decoded = decode_common([d.payload for d in deliveries], limits)
    for delivery, request in zip(deliveries, decoded, strict=True):
        try:
            runnable = request is not None and _runnable(request, delivery, handlers, checked,
                                                         hooks)
        except SchemaError as exc:  # refused by the spec or the handler's hook
            header = decode_request_header(delivery.payload, limits)  # decoded a moment ago
            out.answers.append(answer_without_compute(
                delivery, _partial_request(header.request_id, header.model, header.raw),
                "failed", ErrorInfo.from_exception(exc), now))
        else:
            if runnable and request is not None:
                _admit(delivery, request, now, out)
            else:
                _decode_one(delivery, handlers, limits, now, out)
    return out


def _admit(delivery: Delivery, request: Request, now: float, out: Intake) -> None:
    """A valid request: a job, or an ``expired`` answer once its deadline has passed."""
    if request.deadline_at is not None and request.deadline_at <= now:
        out.answers.append(answer_without_compute(delivery, request, "expired", EXPIRED, now))
    else:
        out.jobs.append(Job(delivery, request))


def _runnable(request: Request, delivery: Delivery, handlers: Mapping[str, ModelHandler],
              checked: set[tuple[Any, ...]],
              hooks: dict[str, Callable[[Tensors], object] | None]) -> bool:
    """:func:`validate_request` for a request the batch decoder read: False leaves a wrong
    lane or an unknown model to the slow path, which says why; a refusal raises.

    The spec check depends only on the model and the input's dtype and shape (the batch
    decoder makes single tensors only), so it runs once per such triple in a fetch; each
    model's ``validate`` hook is looked up once per fetch (``hooks``).
    """
    handler = handlers.get(request.model)
    if handler is None or request.model != delivery.model.partition("@")[0]:
        return False
    inputs = request.inputs
    key = (request.model, inputs.dtype.str, inputs.shape)  # type: ignore[union-attr]
    if key not in checked:
        check_inputs(handler.input_spec, inputs)
        checked.add(key)
    if request.model not in hooks:
        hooks[request.model] = validate_hook(handler)
    hook = hooks[request.model]
    if hook is not None:
        call_validate_hook(hook, inputs)
    return True


def _decode_one(delivery: Delivery, handlers: Mapping[str, ModelHandler], limits: Limits,
                now: float, out: Intake) -> None:
    """One delivery through the single-request decoder, into ``out``."""
    try:
        header = decode_request_header(delivery.payload, limits)
    except DecodeError as exc:
        if exc.request_id is None:
            where = f"{delivery.model}/{delivery.lane}"
            out.undecodable.append((delivery, Undecodable(delivery.payload, str(exc), where)))
            return
        out.answers.append(answer_without_compute(
            delivery, _partial_request(exc.request_id, delivery.model, exc.peeked),
            "failed", ErrorInfo.from_exception(exc), now))
        return
    try:
        request = request_from_header(header)
        # a version lane (``demo-mlp@v2``) carries its model's requests
        if request.model != delivery.model.partition("@")[0]:
            raise ValidationError(
                f"request names model {request.model!r} but was published to the "
                f"{delivery.model!r} lane"
            )
        handler = handlers.get(request.model)
        if handler is None:
            raise UnknownModelError(
                f"model {request.model!r} is not served here (serving: {', '.join(handlers)})"
            )
        validate_request(handler, request.inputs)
    except (SchemaError, UnknownModelError) as exc:
        out.answers.append(answer_without_compute(
            delivery, _partial_request(header.request_id, header.model, header.raw),
            "failed", ErrorInfo.from_exception(exc), now))
        return
    _admit(delivery, request, now, out)


def answers_from_run(
    model: str, version: str, jobs: Sequence[Job], run: BatchRun
) -> tuple[list[Answer], list[tuple[Job, ErrorInfo]]]:
    """Succeeded answers for the outputs, and (job, error) pairs for the failure policy."""
    # One object per batch-wide field: the result template recognises a batch by identity.
    started_at, compute_ms, size = run.started_at, run.compute_s * 1000.0, len(jobs)
    finished_at = started_at + run.compute_s
    answers: list[Answer] = []
    failed: list[tuple[Job, ErrorInfo]] = []
    for job, output in zip(jobs, run.outputs, strict=True):
        req = job.request
        job.model_version = version
        if isinstance(output, BaseException):
            failed.append((job, ErrorInfo.from_exception(output)))
            continue
        # positional, in field order: this runs once per request
        result = Result(
            req.request_id, "succeeded", output, None, model, version, req.attempt,
            req.enqueued_at, started_at, finished_at,
            max(0.0, (started_at - req.enqueued_at) * 1000.0), compute_ms, size,
            req.generation, {}, req.owner,
        )
        answers.append(Answer(job.delivery, result, req.notify, req.generation,
                              req.callback_url, req.notify_format))
    return answers, failed


def split_expired(jobs: Sequence[Job], now: float) -> tuple[list[Job], list[Answer]]:
    """Drop jobs whose deadline passed while they waited in the batcher: they are never run."""
    live: list[Job] = []
    expired: list[Answer] = []
    for job in jobs:
        deadline = job.request.deadline_at
        if deadline is not None and deadline <= now:
            expired.append(answer_without_compute(job.delivery, job.request, "expired",
                                                  EXPIRED, now))
        else:
            live.append(job)
    return live, expired


def _partial_request(request_id: str, model: object, fields: Mapping[str, object]) -> Request:
    """What is known of a request that failed validation: enough to answer it.

    Every field is re-checked, since the request as a whole was refused: a field
    that is itself out of range is left out rather than trusted.
    """
    enqueued = fields.get("enqueued_at")
    callback = fields.get("callback_url")
    owner = fields.get("owner")
    return Request(
        request_id, model if isinstance(model, str) else "", {},
        enqueued_at=float(enqueued) if isinstance(enqueued, int | float) else 0.0,
        notify=_valid_or_none(check_notify, fields.get("notify")),
        notify_format=_valid_or_none(notify_format_of, fields.get("notify_format")),
        callback_url=callback if isinstance(callback, str) else None,
        # without it, the answer to a replayed request would be fenced off as stale
        generation=lua_exact_generation(fields.get("generation")),
        owner=owner if isinstance(owner, str) and len(owner) <= 128 else None,
    )


def _valid_or_none(check: Callable[[object], str | None], value: object) -> str | None:
    try:
        return check(value)
    except ValidationError:
        return None
