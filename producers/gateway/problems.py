"""One JSON error shape for every 4xx and 5xx the gateway answers.

``{"error": {"type": ..., "message": ..., "retryable": ...}}`` is ``ErrorInfo``,
the same triple a failed ``Result`` carries, so a caller handles gateway
refusals and failed inferences with one piece of code.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.schemas.errors import (
    AuthError,
    BatchfleetError,
    DecodeError,
    LimitExceededError,
    OverloadedError,
    QuotaExceededError,
    RequestConflictError,
    RequestLostError,
    RequestNotFoundError,
    ResultStoreError,
    TransportError,
    UnknownModelError,
    UnsupportedMediaTypeError,
    ValidationError,
)

#: Most specific first.
_STATUS: tuple[tuple[type[BatchfleetError], int], ...] = (
    (UnsupportedMediaTypeError, 415),
    (LimitExceededError, 413),
    (DecodeError, 400),
    (ValidationError, 422),
    (UnknownModelError, 404),
    (RequestNotFoundError, 404),
    (RequestConflictError, 409),  # an Idempotency-Key's conflict, or a racing one
    (QuotaExceededError, 429),
    (RequestLostError, 410),
    (OverloadedError, 503),
    (ResultStoreError, 503),
    (TransportError, 503),
)
_HTTP_TYPES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               409: "conflict", 429: "too_many_requests",
               405: "method_not_allowed", 413: "limit_exceeded", 415: "unsupported_media_type"}


def error_body(type_: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"error": ErrorInfo(type_, message[:2000], retryable).to_wire()}


def status_for(exc: BatchfleetError) -> int:
    if isinstance(exc, AuthError):
        return 403 if exc.forbidden else 401
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 500)


def install(app: FastAPI) -> None:
    """Route every error through the one shape."""

    async def batchfleet_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BatchfleetError)
        status = status_for(exc)
        info = ErrorInfo.from_exception(exc)
        if isinstance(exc, AuthError):
            info = ErrorInfo("forbidden" if exc.forbidden else "unauthorized", str(exc))
        headers = {"WWW-Authenticate": "ApiKey"} if status == 401 else None
        if isinstance(exc, QuotaExceededError):  # when to come back, in whole seconds
            headers = {**exc.headers, "Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        if isinstance(exc, OverloadedError):  # past the admission mark: come back soon
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        return JSONResponse({"error": info.to_wire()}, status, headers=headers)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return JSONResponse(error_body(_HTTP_TYPES.get(exc.status_code, "http_error"),
                                       str(exc.detail)), exc.status_code, headers=exc.headers)

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        where = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                          for e in exc.errors())
        return JSONResponse(error_body("validation_error", where or "invalid request"), 422)

    app.add_exception_handler(BatchfleetError, batchfleet_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
