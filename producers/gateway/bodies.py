"""Reading submit bodies: JSON or msgpack, size-limited, into SDK arguments.

The body is read by hand rather than through a pydantic model because it may be
msgpack (with tensors as raw little-endian bytes, as on the wire) and because
the size limit must hold before anything is parsed. Every problem becomes a
typed error that the app turns into one JSON error shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from batchfleet.producers.client import PRIORITIES
from batchfleet.schemas.envelopes import DEGRADE_ALLOW, DEGRADE_CHOICES, check_version_label
from batchfleet.schemas.errors import (
    DecodeError,
    LimitExceededError,
    UnsupportedMediaTypeError,
    ValidationError,
)
from batchfleet.schemas.tensors import DTYPES, Tensors, decode_tensor, is_tensor_map

JSON_TYPES = ("application/json",)
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
_FIELDS = {"inputs", "dtype", "priority", "deadline_s", "callback_url", "version",
           "routing_key", "cache", "degrade"}


@dataclass(frozen=True, slots=True)
class Submission:
    """What one submit (or one batch submit, with several inputs) asks for."""

    inputs: list[Tensors]
    priority: str
    deadline_s: float | None
    callback_url: str | None
    #: A version label to pin to, and what routing hashes (docs/rollout.md, "Routing").
    version: str | None = None
    routing_key: str | None = None
    #: False: never answered from the result cache, nor stored in it (docs/cache.md).
    cache: bool = True
    #: ``never``: fail closed (``unavailable``) instead of a fallback answer.
    degrade: str = DEGRADE_ALLOW


async def read_limited(content_length: str | None, chunks: AsyncIterator[bytes],
                       limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to be over ``limit``."""
    if content_length and content_length.isdigit() and int(content_length) > limit:
        raise LimitExceededError(f"request body is {content_length} bytes; the limit is {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise LimitExceededError(f"request body is over the {limit}-byte limit")
        parts.append(chunk)
    return b"".join(parts)


def decode_body(raw: bytes, content_type: str | None) -> Any:
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    if media in JSON_TYPES:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from exc
    if media in MSGPACK_TYPES:
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_ext_len=0)
        except Exception as exc:  # msgpack raises many unrelated types for garbage
            raise DecodeError(f"body is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    raise UnsupportedMediaTypeError(
        f"content type {media!r} is not supported; send application/json or application/msgpack")


def parse_submission(doc: Any, *, batch: bool, max_items: int) -> Submission:
    if not isinstance(doc, Mapping):
        raise ValidationError("body must be an object with an 'inputs' field")
    unknown = set(doc) - _FIELDS
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    if "inputs" not in doc:
        raise ValidationError("'inputs' is required")
    dtype = doc.get("dtype")
    if dtype is not None:
        dtype = _choice(dtype, "dtype", sorted(DTYPES))
    if batch:
        items = doc["inputs"]
        if not isinstance(items, list) or not items:
            raise ValidationError("'inputs' of a batch must be a non-empty array, one per request")
        if len(items) > max_items:
            raise ValidationError(f"a batch holds at most {max_items} requests, got {len(items)}")
        inputs = [to_tensors(item, dtype, f"inputs[{i}]") for i, item in enumerate(items)]
    else:
        inputs = [to_tensors(doc["inputs"], dtype, "inputs")]
    priority = _choice(doc.get("priority", "interactive"), "priority", list(PRIORITIES))
    callback = doc.get("callback_url")
    if callback is not None and not isinstance(callback, str):
        raise ValidationError("callback_url must be a string or null")
    cache = doc.get("cache", True)
    if cache is not None and not isinstance(cache, bool):
        raise ValidationError("cache must be true, false or null")
    degrade = doc.get("degrade")
    return Submission(inputs, priority, _deadline(doc.get("deadline_s")),
                      callback, check_version_label(doc.get("version")),
                      _routing_key(doc.get("routing_key")), cache is not False,
                      DEGRADE_ALLOW if degrade is None
                      else _choice(degrade, "degrade", list(DEGRADE_CHOICES)))


def _choice(value: Any, name: str, allowed: list[str]) -> str:
    """One of ``allowed``; anything else, a list or an object too, is a 422 naming them."""
    if not isinstance(value, str) or value not in allowed:
        raise ValidationError(f"{name} must be one of {', '.join(allowed)}, got {_shown(value)}")
    return value


def _deadline(value: Any) -> float | None:
    """Positive seconds that fit a float: a 400-digit JSON integer is refused, not a 500."""
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise ValidationError(f"deadline_s must be a positive number of seconds (a float), or "
                          f"null, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A short echo of a bad value (a huge integer is named by its size, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list | dict) and len(value) > 8:
        return f"a {'list' if isinstance(value, list) else 'map'} of {len(value)} items"
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit, deep inside a list
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _routing_key(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 256):
        raise ValidationError("routing_key must be a string of 1-256 characters, or null")
    return value


def to_tensors(value: Any, dtype: str | None, where: str) -> Tensors:
    """A nested list (or a wire tensor map, or named ones) into arrays the SDK can send."""
    if is_tensor_map(value):
        return decode_tensor(value, where)
    if isinstance(value, Mapping):
        if not value:
            raise ValidationError(f"{where}: named inputs must not be empty")
        return {str(k): _array(v, dtype, f"{where}.{k}") for k, v in value.items()}
    return _array(value, dtype, where)


def _array(value: Any, dtype: str | None, where: str) -> np.ndarray[Any, Any]:
    if is_tensor_map(value):
        return decode_tensor(value, where)
    if isinstance(value, str | bytes | Mapping) or value is None:
        raise ValidationError(f"{where}: expected a number or a (nested) array of numbers")
    try:
        array = np.asarray(value, dtype=None if dtype is None else DTYPES[dtype])
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{where}: not a tensor: {exc}") from exc
    kind = array.dtype.kind
    if dtype is None:
        if kind == "f":
            with np.errstate(over="ignore"):
                array = array.astype(np.float32)  # JSON floats: float32, like the SDK
        elif kind in "iu":
            array = array.astype(np.int64)
        elif kind != "b":
            raise ValidationError(f"{where}: expected numbers, got {array.dtype} values")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise ValidationError(f"{where}: numbers must be finite (and fit in {array.dtype})")
    if array.ndim > 8:
        raise ValidationError(f"{where}: at most 8 dimensions")
    return array
