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

from batchfleet.schemas.envelopes import DEFAULT_LIMITS, ErrorInfo
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.tensors import (
    DTYPES,
    MAX_NAMED_TENSORS,
    Array,
    Tensors,
    as_array,
    encode_tensors,
)
from batchfleet.schemas.validation import MAX_NDIM

#: Error type of rows that could not be turned into a request (bad JSON, missing inputs...).
INVALID_ROW: Final = "invalid_row"
#: The most tensor bytes one row may carry: a request over the workers' default message
#: limit would be refused by every worker, so it is refused here, as that row's error.
MAX_ROW_BYTES: Final = DEFAULT_LIMITS.max_message_bytes - 64 * 1024


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

    Raises ``ValidationError`` for values that are not a tensor, and for NaN or infinite
    numbers (also ones too large for the dtype they are cast to).
    """
    with np.errstate(over="ignore"):  # too large for float32: refused below, as not finite
        array = as_array(value)
    if array.dtype.name not in DTYPES or array.ndim > MAX_NDIM:
        raise ValidationError(f"inputs are not a supported tensor: {array.dtype}[{array.ndim}-d]")
    if dtype == "auto":
        array = array.astype(np.float32) if array.dtype == np.float64 else array
    else:
        target = DTYPES[dtype]
        with np.errstate(over="ignore", invalid="ignore"):
            array = array if array.dtype == target else array.astype(target)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        # As the gateway refuses them: NaN and infinity are no input, and would come back
        # as outputs no strict JSON reader takes.
        raise ValidationError(f"inputs: numbers must be finite (and fit in {array.dtype})")
    return array


def coerce_tensors(value: Any, dtype: str) -> Tensors:
    """A row's inputs as tensors a request can carry, or ``ValidationError`` saying why not.

    Everything the request envelope would refuse at submit time (too many named
    tensors, names that are not UTF-8, too many bytes) is checked here, per row:
    raised later, in a submit of a whole chunk, it would stop the job instead.
    """
    if not isinstance(value, Mapping):
        array = coerce_array(value, dtype)
        _check_size(array)
        return array
    if not value:
        raise ValidationError("inputs is an empty map: no tensors")
    if len(value) > MAX_NAMED_TENSORS:
        raise ValidationError(f"inputs has {len(value)} named tensors; a request carries at "
                              f"most {MAX_NAMED_TENSORS}")
    tensors = {_tensor_name(k): coerce_array(v, dtype) for k, v in value.items()}
    _check_size(*tensors.values())
    return tensors


def _tensor_name(key: Any) -> str:
    name = str(key)
    try:
        name.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(f"tensor name {name!r} is not valid UTF-8") from exc
    return name


def _check_size(*arrays: Array) -> None:
    size = sum(a.nbytes for a in arrays)
    if size > MAX_ROW_BYTES:
        raise ValidationError(f"inputs are {size:,} bytes as tensors; a request carries at "
                              f"most {MAX_ROW_BYTES:,}")


def encode_problem(inputs: Tensors | None) -> str | None:
    """Why the request envelope refuses these inputs, or None.

    The last line of defence behind ``coerce_tensors``: when a chunk's submit is
    refused, this finds the rows to blame, so they fail alone and the rest go on.
    """
    try:
        encode_tensors(inputs)
    except (ValidationError, ValueError, TypeError, OverflowError) as exc:
        return str(exc) or type(exc).__name__
    return None


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
    #: Of ``succeeded``, the rows a fallback answered (docs/degradation.md).
    degraded: int = 0

    def to_fields(self) -> dict[str, int]:
        return {f"pos_{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_fields(cls, raw: Mapping[str, Any]) -> Position:
        return cls(**{f.name: int(raw.get(f"pos_{f.name}") or 0) for f in fields(cls)})
