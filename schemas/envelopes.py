"""Request and result envelopes: msgpack maps with a schema version.

The wire format is documented byte by byte in ``docs/wire-format.md``. Decoding
checks size limits *before* unpacking, then every field's type, so a malformed
message becomes a typed error that names what was wrong, never a crash.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgpack

from batchfleet.schemas.errors import DecodeError, LimitExceededError, SchemaError, ValidationError
from batchfleet.schemas.names import (
    LANE_INTERACTIVE,
    check_lane,
    check_model_name,
    check_request_id,
)
from batchfleet.schemas.tensors import Tensors, decode_tensors, encode_tensors
from batchfleet.schemas.validation import check_notify

SCHEMA_VERSION: Final = 1
#: A version label (``--model NAME@LABEL=SPEC``): it names lanes and registry fields.
_LABEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

Status = Literal["pending", "succeeded", "failed", "expired", "cancelled"]
STATUSES: Final = ("pending", "succeeded", "failed", "expired", "cancelled")
#: A request's ``degrade``: ``allow`` (default) takes a model's fallback answer, ``never``
#: fails closed with ``unavailable`` instead (docs/degradation.md).
DEGRADE_ALLOW: Final = "allow"
DEGRADE_NEVER: Final = "never"
DEGRADE_CHOICES: Final = (DEGRADE_ALLOW, DEGRADE_NEVER)
#: Why a result was degraded (``Result.degraded_reason``): the four triggers.
DEGRADE_REASONS: Final = ("error", "breaker", "deadline", "overload")
#: ``cancelled``: a cancel or a lane purge answered it before any worker computed it.
TERMINAL_STATUSES: Final = frozenset({"succeeded", "failed", "expired", "cancelled"})

#: Announcement formats a request's ``notify_format`` asks for (docs/wire-format.md §8).
#: ``ids`` (what a request that does not ask gets): the IDs, comma-joined, as clients
#: written before one-hop delivery read them. ``results``: a msgpack array alternating
#: ID and result body, so the waiter needs no read-back.
NOTIFY_IDS: Final = "ids"
NOTIFY_RESULTS: Final = "results"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a decoder accepts. A message over them is refused before it is unpacked."""

    max_message_bytes: int = 16 * 1024 * 1024
    max_container_len: int = 1_000_000


DEFAULT_LIMITS: Final = Limits()

#: The largest integer a Lua script (Redis' scripts use doubles) compares exactly, 2^53 - 1.
#: ``generation`` and ``attempt`` reach the result-store scripts, so the wire caps them here.
MAX_EXACT_INT: Final = 2**53 - 1


def lua_exact_generation(value: object) -> int:
    """A generation the store's scripts compare exactly, or 0 for one out of range.

    Answers to bad input carry the generation read from the raw message; one out of
    range would be misread inside Lua (2^64-1 reads as -1) and the write refused, so
    such an answer is written under generation 0 instead, which the store accepts.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXACT_INT:
        return 0
    return value


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What went wrong, in a form a caller in any language can act on."""

    type: str
    message: str
    retryable: bool = False

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        wire_type = getattr(exc, "wire_type", "internal_error")
        retryable = bool(getattr(exc, "retryable", False))
        message = str(exc) or type(exc).__name__
        if not hasattr(exc, "wire_type"):
            message = f"{type(exc).__name__}: {message}"
        return cls(type=wire_type, message=message[:2000], retryable=retryable)

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "retryable": self.retryable}


@dataclass(slots=True)
class Request:
    """One inference request as it travels through the broker."""

    request_id: str
    model: str
    inputs: Tensors
    lane: str = LANE_INTERACTIVE
    enqueued_at: float = 0.0
    deadline_at: float | None = None
    callback_url: str | None = None
    notify: str | None = None
    attempt: int = 1
    generation: int = 0
    #: One entry per failed attempt so far: {"attempt", "type", "message", "at"}.
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The API key ID that submitted it (gateway) or that the SDK named; None: no owner.
    owner: str | None = None
    #: A version label this request is pinned to (evaluations, A/B); None: the policy routes.
    version: str | None = None
    #: What routing hashes instead of the request ID, so one user always sees one version.
    routing_key: str | None = None
    #: W3C trace context of the submit span (tracing on); a malformed one is ignored.
    traceparent: str | None = None
    #: False: never answer it from the result cache, nor store its result (docs/cache.md).
    cache: bool = True
    #: How its announcement is framed: ``NOTIFY_RESULTS``, or None for ``NOTIFY_IDS``.
    notify_format: str | None = None
    #: ``DEGRADE_NEVER``: fail closed (``unavailable``) rather than take a fallback answer.
    degrade: str = "allow"
    #: Set on a pipeline step's request (docs/pipelines.md): ``{name, id, step, notify,
    #: notify_format, callback_url, owner, enqueued_at, done}``, where ``id`` is the caller's
    #: request ID (which carries the final result) and ``done`` the earlier steps' records.
    pipeline: dict[str, Any] | None = None


@dataclass(slots=True)
class Result:
    """The answer to one request; ``status`` is ``pending`` until a worker writes a terminal one."""

    request_id: str
    status: Status
    outputs: Tensors | None = None
    error: ErrorInfo | None = None
    model: str = ""
    model_version: str = ""
    attempts: int = 0
    enqueued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    queue_ms: float | None = None
    compute_ms: float | None = None
    batch_size: int | None = None
    generation: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Who submitted it (see ``Request.owner``); only admin-scoped keys read ownerless ones.
    owner: str | None = None
    #: Answered from the result cache (computed earlier by ``model_version``; docs/cache.md).
    cached: bool = False
    #: Answered by a fallback step, not by the model (docs/degradation.md): why, and which.
    degraded: bool = False
    degraded_reason: str | None = None
    fallback: str | None = None
    #: The failure that caused the degradation (``error`` stays None on a success).
    degraded_error: ErrorInfo | None = None
    #: A pipeline's result: one record per step (docs/pipelines.md), in the order they ran.
    steps: list[dict[str, Any]] | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


# --- encoding ------------------------------------------------------------------------


def encode_request(req: Request) -> bytes:
    """Pack a request, validating the fields that become names (model, ID, lane) and the
    integers the result store's scripts compare (attempt, generation)."""
    check_request_id(req.request_id)
    check_model_name(req.model)
    check_lane(req.lane)
    for key in ("attempt", "generation"):
        _int({key: getattr(req, key)}, key, 0)
    if req.notify:
        check_notify(req.notify)
    _owner(req.owner)
    check_version_label(req.version)
    _routing_key(req.routing_key)
    notify_format = notify_format_of(req.notify_format)
    body: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "id": req.request_id,
        "model": req.model,
        "lane": req.lane,
        "enqueued_at": req.enqueued_at,
        "deadline_at": req.deadline_at,
        "callback_url": req.callback_url,
        "notify": req.notify,
        "attempt": req.attempt,
        "generation": req.generation,
        "errors": req.history,
        **({} if notify_format is None else {"notify_format": notify_format}),
        **({} if req.owner is None else {"owner": req.owner}),
        **({} if req.version is None else {"version": req.version}),
        **({} if req.routing_key is None else {"routing_key": req.routing_key}),
        **({} if req.traceparent is None else {"traceparent": req.traceparent}),
        **({} if req.cache else {"cache": False}),
        **({} if req.degrade == DEGRADE_ALLOW else {"degrade": degrade_of(req.degrade)}),
        **({} if req.pipeline is None else {"pipeline": req.pipeline}),
        # Last, so a damaged or oversized message still has a readable header.
        "inputs": encode_tensors(req.inputs),
    }
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def encode_result(res: Result) -> bytes:
    # A degraded result's map starts with ``degraded: true``: the result store recognises
    # a reopenable degraded success by that prefix (``connectors/values.py::reopenable``),
    # never by searching the body, whose outputs may hold any bytes.
    body: dict[str, Any] = {"degraded": True} if res.degraded else {}
    body |= {
        "v": SCHEMA_VERSION,
        "id": res.request_id,
        "status": res.status,
        "outputs": None if res.outputs is None else encode_tensors(res.outputs),
        "error": None if res.error is None else res.error.to_wire(),
        "model": res.model,
        "model_version": res.model_version,
        "attempts": res.attempts,
        "enqueued_at": res.enqueued_at,
        "started_at": res.started_at,
        "finished_at": res.finished_at,
        "queue_ms": res.queue_ms,
        "compute_ms": res.compute_ms,
        "batch_size": res.batch_size,
        "generation": res.generation,
    }
    if res.owner is not None:
        body["owner"] = res.owner
    if res.cached:
        body["cached"] = True
    if res.degraded:
        body["degraded_reason"] = res.degraded_reason
        body["fallback"] = res.fallback
        body["degraded_error"] = (None if res.degraded_error is None
                                  else res.degraded_error.to_wire())
    if res.steps is not None:
        body["steps"] = res.steps
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


# --- decoding ------------------------------------------------------------------------


def peek_header(raw: bytes, max_keys: int = 16) -> dict[str, Any]:
    """Read the small leading fields (id, model, notify) of a map without unpacking the rest.

    Used on messages that fail to decode (too big, truncated) so they can still
    get a ``failed`` result instead of vanishing into the dead-letter stream.
    """
    found: dict[str, Any] = {}
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1))
    unpacker.feed(raw)
    try:
        for _ in range(min(unpacker.read_map_header(), max_keys)):
            key = unpacker.unpack()
            if key in ("v", "id", "model", "notify", "notify_format", "enqueued_at",
                       "generation", "callback_url"):
                found[key] = unpacker.unpack()
            else:
                unpacker.skip()
    except Exception:  # whatever was read before the damage is all there is
        return found
    return found


def _decode_error(message: str, raw: bytes, cls: type[DecodeError] = DecodeError) -> DecodeError:
    peeked = peek_header(raw)
    return cls(message, raw=raw, request_id=_peek_id(peeked), peeked=peeked)


def _unpack(raw: bytes, limits: Limits) -> dict[str, Any]:
    if len(raw) > limits.max_message_bytes:
        raise _decode_error(
            f"message is {len(raw)} bytes; the limit is {limits.max_message_bytes}", raw,
            LimitExceededError)
    n = limits.max_container_len
    try:
        obj = msgpack.unpackb(
            raw, raw=False, strict_map_key=True,
            max_bin_len=limits.max_message_bytes, max_str_len=limits.max_message_bytes,
            max_array_len=n, max_map_len=n, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many unrelated types for garbage input
        raise _decode_error(f"not a msgpack envelope: {type(exc).__name__}: {exc}", raw) from exc
    if not isinstance(obj, dict):
        raise DecodeError(f"envelope must be a msgpack map, got {type(obj).__name__}", raw=raw)
    version = obj.get("v")
    if version != SCHEMA_VERSION:
        raise DecodeError(
            f"schema version {version!r} is not supported (expected {SCHEMA_VERSION})",
            raw=raw, request_id=_peek_id(obj), peeked=obj,
        )
    return obj


def _peek_id(obj: Mapping[str, Any]) -> str | None:
    rid = obj.get("id")
    try:
        return check_request_id(rid) if isinstance(rid, str) else None
    except ValidationError:
        return None


def _opt_float(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{key} must be a finite number, got {value!r}")
    return float(value)


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ValidationError(f"{key} must be a string, got {type(value).__name__}")
    return value


def _int(obj: Mapping[str, Any], key: str, default: int) -> int:
    value = obj.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 0 <= value <= MAX_EXACT_INT):
        raise ValidationError(f"{key} must be an integer from 0 to {MAX_EXACT_INT} "
                              f"(2^53-1), got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """The parts of a request a worker needs to answer it even when its inputs are invalid."""

    request_id: str
    model: str
    raw: dict[str, Any]


def decode_request_header(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> RequestHeader:
    """Unpack and read ID and model. Raises :class:`DecodeError` when even those are missing."""
    obj = _unpack(raw, limits)
    rid, model = _peek_id(obj), obj.get("model")
    if rid is None:
        raise DecodeError(f"request has no valid 'id' (got {obj.get('id')!r})", raw=raw)
    if not isinstance(model, str):
        raise DecodeError(f"request {rid} has no 'model' string", raw=raw, request_id=rid,
                          peeked=obj)
    return RequestHeader(rid, model, obj)


def request_from_header(header: RequestHeader) -> Request:
    """Validate the rest of a request. Raises :class:`ValidationError` naming the bad field."""
    obj = header.raw
    lane = obj.get("lane", LANE_INTERACTIVE)
    if not isinstance(lane, str):
        raise ValidationError(f"lane must be a string, got {lane!r}")
    return Request(
        request_id=header.request_id,
        model=check_model_name(header.model),
        inputs=decode_tensors(obj.get("inputs")),
        lane=check_lane(lane),
        enqueued_at=_opt_float(obj, "enqueued_at") or 0.0,
        deadline_at=_opt_float(obj, "deadline_at"),
        callback_url=_opt_str(obj, "callback_url"),
        notify=_notify(obj.get("notify")),
        attempt=max(1, _int(obj, "attempt", 1)),
        generation=_int(obj, "generation", 0),
        history=_history(obj.get("errors")),
        owner=_owner(obj.get("owner")),
        version=check_version_label(obj.get("version")),
        routing_key=_routing_key(obj.get("routing_key")),
        traceparent=_traceparent(obj.get("traceparent")),
        cache=_cache_flag(obj.get("cache", True)),
        notify_format=notify_format_of(obj.get("notify_format")),
        degrade=degrade_of(obj.get("degrade")),
        pipeline=_pipeline(obj.get("pipeline")),
    )


def degrade_of(value: Any) -> str:
    """``degrade``: absent or nil reads ``allow``; ``never`` fails closed."""
    if value is None:
        return DEGRADE_ALLOW
    if value not in DEGRADE_CHOICES:
        raise ValidationError(f"degrade must be 'allow' or 'never', got {value!r}")
    return str(value)


def _cache_flag(value: Any) -> bool:
    """``cache``: absent, nil or true reads the result cache; false opts the request out."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ValidationError(f"cache must be true or false, got {value!r}")
    return value


def _traceparent(value: Any) -> str | None:
    """Kept only when shaped like one (W3C: a bad traceparent is ignored, never an error)."""
    if isinstance(value, str) and len(value) == 55 and value[2] == value[35] == value[52] == "-":
        return value
    return None


def check_version_label(value: Any) -> str | None:
    """A pinned version label: the ``@VERSION`` of ``--model NAME@VERSION=SPEC``."""
    if value is None:
        return None
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise ValidationError(f"version must be a label of 1-64 letters, digits or ._- "
                              f"(as in --model NAME@LABEL=SPEC), got {value!r}")
    return value


def _routing_key(value: Any) -> str | None:
    """Any short string: it is only hashed, never used as a name."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ValidationError(f"routing_key must be a string of 1-256 characters, got {value!r}")
    return value


def _owner(value: Any) -> str | None:
    """An API key ID: it becomes part of a quota key name, so it follows the request-ID rules."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"owner must be a string, got {type(value).__name__}")
    try:
        return check_request_id(value)
    except ValidationError:
        raise ValidationError(f"owner {value!r} must be 1-128 characters of letters, "
                              "digits or ._:@-") from None


def _notify(value: Any) -> str | None:
    """The client ID becomes part of a channel name, so it follows the request-ID rules;
    nil or ``""`` means no announcement (docs/wire-format.md §3)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValidationError(f"notify must be a string, got {type(value).__name__}")
    return check_notify(value)


def notify_format_of(value: Any) -> str | None:
    """``NOTIFY_RESULTS``, or None for the comma-joined IDs every client understands.

    A format this worker does not know gets the IDs too, rather than a failure: a
    newer client must read them anyway (cancels announce that way, §8)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"notify_format must be a string, got {type(value).__name__}")
    return NOTIFY_RESULTS if value == NOTIFY_RESULTS else None


def _history(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise ValidationError("errors must be a list of maps")
    return value


def decode_request(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Request:
    """Decode and validate a whole request in one call (producers and tests use this)."""
    return request_from_header(decode_request_header(raw, limits))


def decode_result(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Result:
    obj = _unpack(raw, limits)
    rid = _peek_id(obj)
    status = obj.get("status")
    if rid is None or status not in STATUSES:
        raise DecodeError(f"result needs a valid 'id' and 'status', got {status!r}", raw=raw)
    error = _error_info(obj.get("error"))
    outputs = obj.get("outputs")
    try:
        decoded = None if outputs is None else decode_tensors(outputs, "outputs")
    except SchemaError as exc:
        raise DecodeError(f"result {rid}: {exc}", raw=raw, request_id=rid) from exc
    return Result(
        request_id=rid,
        status=status,
        outputs=decoded,
        error=error,
        model=str(obj.get("model", "")),
        model_version=str(obj.get("model_version", "")),
        attempts=int(obj.get("attempts") or 0),
        enqueued_at=float(obj.get("enqueued_at") or 0.0),
        started_at=_opt_float(obj, "started_at"),
        finished_at=_opt_float(obj, "finished_at"),
        queue_ms=_opt_float(obj, "queue_ms"),
        compute_ms=_opt_float(obj, "compute_ms"),
        batch_size=obj.get("batch_size"),
        generation=int(obj.get("generation") or 0),
        owner=_owner(obj.get("owner")),
        cached=obj.get("cached") is True,
        degraded=obj.get("degraded") is True,
        degraded_reason=_str_or_none(obj.get("degraded_reason")),
        fallback=_str_or_none(obj.get("fallback")),
        degraded_error=_error_info(obj.get("degraded_error")),
        steps=_steps(obj.get("steps")),
    )


def _pipeline(value: Any) -> dict[str, Any] | None:
    """``pipeline``: nil, or a map naming the pipeline, the caller's ID and the step."""
    if value is None:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("step"), str)):
        raise ValidationError(f"pipeline must be a map with name, id and step, got {value!r}")
    check_request_id(value.get("id"))
    return value


def _steps(value: Any) -> list[dict[str, Any]] | None:
    return [dict(s) for s in value if isinstance(s, Mapping)] if isinstance(value, list) \
        else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error_info(err: Any) -> ErrorInfo | None:
    if not isinstance(err, Mapping):
        return None
    return ErrorInfo(type=str(err.get("type", "internal_error")),
                     message=str(err.get("message", "")),
                     retryable=bool(err.get("retryable", False)))
