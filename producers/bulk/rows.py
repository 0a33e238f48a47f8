"""The two small records every stage of a bulk job shares: a ``Row`` and a ``Position``.

A ``Row`` is one input row, already turned into tensors, or marked invalid
with the reason (it is then answered locally, never submitted). A
``Position`` is how far a job got, durably: it is the checkpoint stored in
Redis, and everything needed to truncate the output and seek the input on a
resume is in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

import numpy as np

from schemas.envelopes import ErrorInfo
from schemas.errors import ValidationError
from schemas.tensors import DTYPES, MAX_NDIM, Array, Tensors, as_array

#: Error type of rows that could not be turned into a request (bad JSON, missing inputs...).
INVALID_ROW: Final = "invalid_row"


@dataclass(slots=True)
class Row:
    #: 0-based row index: the request ID suffix and the output's row number.
    index: int
    inputs: Tensors | None
    custom_id: Any = None
    #: 1-based line in a JSONL input, for the errors file.
    line: int | None = None
    #: Set for a row that is never submitted: it goes straight to the errors file.
    error: ErrorInfo | None = None
    #: JSONL resume point just past this row: byte offset and lines consumed.
    end_offset: int = 0
    end_line: int = 0


def invalid_row(index: int, message: str, **where: Any) -> Row:
    return Row(index, None, error=ErrorInfo(INVALID_ROW, message, retryable=False), **where)


def coerce_array(value: Any, dtype: str) -> Array:
    """One input as an array: ``auto`` sends floats as float32 (the SDK's rule for lists).

    Raises ``ValidationError`` (from ``as_array``) for values that are not a tensor.
    """
    array = as_array(value)
    if array.dtype.name not in DTYPES or array.ndim > MAX_NDIM:
        raise ValidationError(f"inputs are not a supported tensor: {array.dtype}[{array.ndim}-d]")
    if dtype == "auto":
        return array.astype(np.float32) if array.dtype == np.float64 else array
    target = DTYPES[dtype]
    return array if array.dtype == target else array.astype(target)


def coerce_tensors(value: Any, dtype: str) -> Tensors:
    if isinstance(value, Mapping):
        return {str(k): coerce_array(v, dtype) for k, v in value.items()}
    return coerce_array(value, dtype)


@dataclass(frozen=True, slots=True)
class Position:
    """A durable point in a job: rows ``[0, rows)`` are in the output files, fsynced."""

    rows: int = 0
    in_offset: int = 0
    in_line: int = 0
    out_offset: int = 0
    err_offset: int = 0
    parts: int = 0
    succeeded: int = 0
    failed: int = 0

    def to_fields(self) -> dict[str, int]:
        return {f"pos_{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_fields(cls, raw: Mapping[str, Any]) -> Position:
        return cls(**{f.name: int(raw.get(f"pos_{f.name}") or 0) for f in fields(cls)})
