"""One error hierarchy for the whole project, rooted at :class:`BatchfleetError`.

It lives in ``schemas`` because every other package may import ``schemas`` and
nothing else, so this is the one place all of them can share. Each error knows
its wire ``type`` (what a caller sees in ``Result.error.type``) and whether it
is worth retrying, so the failure policy never has to guess from a message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class BatchfleetError(Exception):
    """Root of every error batchfleet raises on purpose."""

    wire_type = "internal_error"
    retryable = False


# --- wire contract -------------------------------------------------------------------


class SchemaError(BatchfleetError):
    """The message does not follow the wire contract."""

    wire_type = "schema_error"


class DecodeError(SchemaError):
    """Bytes that are not a readable envelope. Keeps the raw bytes for the dead-letter stream."""

    wire_type = "decode_error"

    def __init__(
        self,
        message: str,
        raw: bytes = b"",
        request_id: str | None = None,
        peeked: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.raw = raw
        self.request_id = request_id
        #: Header fields read before the damage (id, model, notify), for answering anyway.
        self.peeked: Mapping[str, Any] = peeked or {}


class LimitExceededError(DecodeError):
    """A message over the size, depth or element limits; refused before it is unpacked."""

    wire_type = "limit_exceeded"


class ValidationError(SchemaError):
    """A readable envelope whose contents are wrong: dtype, shape, missing field, bad ID."""

    wire_type = "validation_error"


# --- configuration -------------------------------------------------------------------


class ConfigError(BatchfleetError):
    """A setting, URL or model spec that cannot work; raised at start-up, never mid-run."""

    wire_type = "config_error"


class URLError(ConfigError):
    """A ``--broker``/``--results`` URL that is malformed or names no known scheme;
    ``url`` is the URL as given. Refused before anything connects."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url


# --- models --------------------------------------------------------------------------


class ModelError(BatchfleetError):
    """The model raised while computing a batch."""

    wire_type = "model_error"
    retryable = True


class ModelNotLoadedError(ModelError):
    """A batch reached a model version that is not loaded (``--max-loaded-models``: its
    lane should have been paused); retried, so it runs once the model is loaded."""


class UnknownModelError(ModelError):
    """A request names a model this worker does not serve."""

    wire_type = "unknown_model"
    retryable = False


class OutputMismatchError(ModelError):
    """The model returned a different number of outputs than it was given inputs."""

    wire_type = "output_mismatch"


class ComputeTimeoutError(ModelError):
    """A batch took longer than the compute timeout."""

    wire_type = "timeout"


class StalledError(ComputeTimeoutError):
    """A request stalled the compute thread twice: quarantined (DLQ), never handed on."""

    wire_type = "stalled"
    retryable = False


class OutOfMemoryError(ModelError):
    """The device ran out of memory; the batch is split and retried smaller."""

    wire_type = "oom"


# --- brokers and the result store ----------------------------------------------------


class TransportError(BatchfleetError):
    """The broker (Redis Streams or Kafka) failed or is unreachable."""

    wire_type = "transport_error"
    retryable = True


class ResultStoreError(BatchfleetError):
    """The result store failed or is unreachable."""

    wire_type = "store_unavailable"
    retryable = True


# --- callers -------------------------------------------------------------------------


class WaitTimeoutError(BatchfleetError, TimeoutError):
    """``wait()`` gave up before the request reached a terminal status."""

    wire_type = "wait_timeout"


# --- webhooks and the HTTP gateway ---------------------------------------------------


class CallbackRefusedError(ValidationError):
    """A callback URL outside the allowlist, or one that points at a private address.

    A ``ValidationError`` so that a bad URL is refused at submit, like any bad field."""

    wire_type = "callback_refused"


class WebhookDeliveryError(BatchfleetError):
    """A webhook could not be delivered this time (receiver down, non-2xx, result not yet
    written); the delivery job raises it so that RQ retries with backoff."""

    wire_type = "webhook_delivery"
    retryable = True


class AuthError(BatchfleetError):
    """A gateway request without a valid API key (401), or one for a model its key may
    not use (403, ``forbidden`` true)."""

    wire_type = "unauthorized"

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


class UnsupportedMediaTypeError(DecodeError):
    """A gateway body in a content type other than JSON or msgpack (HTTP 415)."""

    wire_type = "unsupported_media_type"


class RequestNotFoundError(BatchfleetError):
    """No result record for this request ID: never submitted, or expired (HTTP 404)."""

    wire_type = "not_found"


class RequestConflictError(BatchfleetError):
    """A request ID reused with another model or other inputs (HTTP 409): the first
    submit's record stands and the new request was not enqueued, so waiting on the ID
    would return the first request's result. Use a new ID for a new request.
    ``request_ids`` names the refused IDs; ``accepted`` those a ``submit_many`` did
    enqueue (every other one of the call, up to the refusal)."""

    wire_type = "request_conflict"

    def __init__(self, message: str, request_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.request_ids = list(request_ids)
        self.accepted: list[str] = []


class IdempotencyConflictError(RequestConflictError):
    """An Idempotency-Key reused with another model or another body (HTTP 409)."""

    wire_type = "idempotency_conflict"


class QuotaExceededError(BatchfleetError):
    """An API key over its request rate or its in-flight limit (HTTP 429); nothing was
    enqueued. ``retry_after_s`` says when trying again can succeed."""

    wire_type = "quota_exceeded"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float = 1.0,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        #: RateLimit-* headers for the refusal.
        self.headers: Mapping[str, str] = headers or {}


# --- model inputs --------------------------------------------------------------------


class InvalidInputError(ValidationError):
    """One request's inputs are outside what the model accepts (a token ID past the
    vocabulary, say). Raised by a handler's ``validate`` hook at intake, or from
    ``preprocess``/``predict``: the request fails once, is never retried, and never
    counts against the model's circuit breaker."""


# --- state loss and admission --------------------------------------------------------


class RequestLostError(BatchfleetError):
    """Waiting on requests that can no longer finish: their pending record is gone (Redis
    lost its data, or the ID never existed), or their lane's stream lost its entries after
    they were enqueued. Submitting them again (same IDs) is safe: a finished ID is never
    run twice. ``results`` holds what the same wait did get (None for each lost ID)."""

    wire_type = "request_lost"
    retryable = True

    def __init__(self, request_ids: list[str], results: list[Any] | None = None) -> None:
        shown = ", ".join(request_ids[:5]) + (" ..." if len(request_ids) > 5 else "")
        super().__init__(f"{len(request_ids)} request(s) lost and will never finish "
                         f"(submit them again): {shown}")
        self.request_ids = request_ids
        self.results: list[Any] = results or []


class OverloadedError(BatchfleetError):
    """New work refused: the store or a lane is past its admission mark. Retry after
    ``retry_after_s``; the mark leaves room for workers to drain what is queued."""

    wire_type = "overloaded"
    retryable = True

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        #: IDs a ``submit_many`` had already enqueued before the refusal (they will run).
        self.accepted: list[str] = []


class UnavailableError(BatchfleetError):
    """The model could not answer and the caller refused a fallback (``degrade="never"``):
    failed closed at once instead of degraded. Retryable: the model may be back later."""

    wire_type = "unavailable"
    retryable = True
