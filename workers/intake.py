"""Decoding a fetched batch of deliveries into jobs, or into refusals that need no compute.

Everything that can be decided before the model runs is decided here, for a
whole batch at once: broken bytes, wrong dtype or shape, an unknown model and
a passed deadline, and input outside the model's domain (its handler's
``validate`` hook). Each becomes a terminal answer that explains it (made by
``workers.completion``, where every answer is built); only valid, live requests
go on to the batcher. This module only decodes: the worker visits it once per fetch.
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
    decode_request_header,
    lua_exact_generation,
    notify_format_of,
    request_from_header,
)
from batchfleet.schemas.errors import DecodeError, SchemaError, UnknownModelError, ValidationError
from batchfleet.schemas.tensors import Tensors
from batchfleet.schemas.validation import check_notify
from batchfleet.workers.completion import EXPIRED, answer_without_compute
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.models.handler import (
    ModelHandler,
    call_validate_hook,
    check_inputs,
    validate_hook,
    validate_request,
)


@dataclass(slots=True)
class Intake:
    jobs: list[Job] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    undecodable: list[tuple[Delivery, Undecodable]] = field(default_factory=list)
    #: Jobs a middleware refused to run, with the terminal error the failure policy settles.
    failed: list[tuple[Job, ErrorInfo]] = field(default_factory=list)
    #: Deliveries to ack without a result: already terminal, or superseded by a replay.
    finished: list[Delivery] = field(default_factory=list)


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
