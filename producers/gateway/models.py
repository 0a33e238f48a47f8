"""Response models and request-body schemas: what the published OpenAPI spec shows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from schemas.tensors import DTYPES


class ErrorDetail(BaseModel):
    type: str = Field(description="Stable error type, e.g. validation_error, unknown_model.")
    message: str
    retryable: bool


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Accepted(BaseModel):
    request_id: str
    status: str = "pending"
    location: str = Field(description="Poll or long-poll the result here.")


class BatchAccepted(BaseModel):
    request_ids: list[str]
    status: str = "pending"


class ResultOut(BaseModel):
    request_id: str
    status: str = Field(description="pending, succeeded, failed or expired")
    outputs: Any = Field(None, description="Nested arrays (or named ones) when succeeded.")
    error: ErrorDetail | None = None
    model: str
    model_version: str
    attempts: int
    enqueued_at: float
    started_at: float | None
    finished_at: float | None
    queue_ms: float | None
    compute_ms: float | None
    batch_size: int | None
    generation: int


class Health(BaseModel):
    status: str


_COMMON: dict[str, Any] = {
    "dtype": {"type": "string", "enum": sorted(DTYPES),
              "description": "Element type; default float32 for decimals, int64 for integers."},
    "priority": {"type": "string", "enum": ["interactive", "high", "bulk", "low"],
                 "default": "interactive"},
    "deadline_s": {"type": ["number", "null"], "exclusiveMinimum": 0,
                   "description": "Answer `expired` instead of computing after this long."},
    "callback_url": {"type": ["string", "null"], "maxLength": 2048,
                     "description": "Webhook for the terminal result (see docs/webhooks.md)."},
}
_TENSOR = {"description": "A number, a nested array of numbers, an object of named arrays, "
                          "or (msgpack) a wire tensor map {dtype, shape, data}."}


def body_schema(batch: bool) -> dict[str, Any]:
    inputs = ({"type": "array", "minItems": 1, "items": _TENSOR,
               "description": "One entry per request."} if batch else _TENSOR)
    schema = {"type": "object", "required": ["inputs"], "additionalProperties": False,
              "properties": {"inputs": inputs, **_COMMON}}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema},
        "application/msgpack": {"schema": schema},
    }}}
