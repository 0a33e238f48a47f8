"""Tensor codec: numpy arrays as msgpack maps of dtype, shape and raw little-endian bytes.

A tensor is ``{"dtype": "float32", "shape": [2, 10], "data": <bin>}``. Any
language with a msgpack library can write one. Decoding is zero-copy: the
array is an ``np.frombuffer`` view over the bytes msgpack already allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.validation import MAX_NDIM, check_shape, is_shape

Array: TypeAlias = npt.NDArray[Any]
#: What a request carries and a result returns: one array, or named arrays.
Tensors: TypeAlias = Array | dict[str, Array]

#: Wire dtype name -> little-endian numpy dtype. Anything else is refused.
DTYPES: Final[dict[str, np.dtype[Any]]] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
        "float16", "float32", "float64",
    )
}
_NAME_OF: Final = {dt.str: name for name, dt in DTYPES.items()} | {"|b1": "bool"}

MAX_NAMED_TENSORS: Final = 64


def encode_tensor(array: Array) -> dict[str, Any]:
    """Encode one array. Big-endian input is byte-swapped; other dtypes are refused."""
    arr = np.asarray(array)
    name = wire_dtype(arr.dtype)
    if name is None:
        raise ValidationError(f"dtype {arr.dtype} is not supported; use one of {sorted(DTYPES)}")
    if arr.ndim > MAX_NDIM:
        raise ValidationError(f"tensor has {arr.ndim} dimensions; at most {MAX_NDIM} are allowed")
    data = np.ascontiguousarray(arr, dtype=DTYPES[name]).tobytes()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def wire_dtype(dtype: np.dtype[Any]) -> str | None:
    """The wire name of a dtype (big-endian ones are sent swapped); None: not sendable."""
    name = _NAME_OF.get(dtype.newbyteorder("<").str) if dtype.byteorder == ">" else None
    return name or _NAME_OF.get(dtype.str)


#: (dtype name, shape) -> (dtype, byte count, shape): validated once, then a dict lookup.
_SPECS: dict[tuple[Any, ...], tuple[np.dtype[Any], int, tuple[int, ...]]] = {}
_MAX_CACHED_SPECS = 4096


def decode_tensor(obj: Any, where: str = "inputs") -> Array:
    """Decode one tensor map, checking dtype, shape and byte count; the result is read-only.

    This runs once per request on the worker's hot path, so a (dtype, shape) pair
    is validated the first time it is seen and only looked up afterwards.
    """
    spec = cached_spec(obj)
    if spec is not None:
        return np.frombuffer(obj["data"], dtype=spec[0]).reshape(spec[2])
    return _decode_tensor_checked(obj, where)


def cached_spec(obj: Any) -> tuple[np.dtype[Any], int, tuple[int, ...]] | None:
    """(dtype, byte count, shape) of a tensor map that is valid on a warm cache, else None.

    None means "run the full check": it is how both decoders (one request, or a batch
    in ``schemas.batch_decode``) agree on exactly which tensors take the fast path.
    """
    try:
        data, shape = obj["data"], obj["shape"]
        # is_shape first: 10.0 and True hash like 10 and 1, so the cache alone would
        # accept on a warm cache what the full check refuses on a cold one.
        spec = _SPECS.get((obj["dtype"], *shape)) if is_shape(shape) else None
    except (TypeError, KeyError):
        return None
    if spec is not None and type(data) is bytes and len(data) == spec[1]:
        return spec
    return None


def spec_of(dtype: str, shape: list[int],
            data: bytes) -> tuple[np.dtype[Any], int, tuple[int, ...]] | None:
    """:func:`cached_spec` of a tensor already split into its fields (typed decoding)."""
    spec = _SPECS.get((dtype, *shape)) if is_shape(shape) else None
    if spec is not None and len(data) == spec[1]:
        return spec
    return None


def decode_tensor_parts(dtype: str, shape: list[int], data: bytes,
                        where: str = "outputs") -> Tensors:
    """:func:`decode_tensors` of a tensor already split into its fields (typed decoding):
    a (dtype, shape) seen before is only looked up, with no tensor map built (about 2 us a
    result less for callers, docs/performance.md); anything else takes the full check."""
    spec = spec_of(dtype, shape, data)
    if spec is not None:
        return np.frombuffer(data, dtype=spec[0]).reshape(spec[2])
    return decode_tensors({"dtype": dtype, "shape": shape, "data": data}, where)


def _decode_tensor_checked(obj: Any, where: str) -> Array:
    if not isinstance(obj, Mapping):
        raise ValidationError(f"{where}: expected a tensor map, got {type(obj).__name__}")
    dtype_name, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if not isinstance(dtype_name, str) or not isinstance(data, bytes | bytearray):
        raise ValidationError(
            f"{where}: a tensor needs 'dtype' (string), 'shape' (list) and 'data' (bytes)"
        )
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise ValidationError(
            f"{where}: dtype {dtype_name!r} is not supported; use one of {sorted(DTYPES)}"
        )
    shape = check_shape(shape, where)
    expected = math.prod(shape) * dtype.itemsize
    if len(_SPECS) < _MAX_CACHED_SPECS:
        _SPECS[(dtype_name, *shape)] = (dtype, expected, tuple(shape))
    if len(data) != expected:
        raise ValidationError(
            f"{where}: shape {list(shape)} of {dtype_name} needs {expected} bytes, "
            f"got {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def is_tensor_map(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "dtype" in obj and "data" in obj


def encode_tensors(value: Tensors | Any) -> dict[str, Any]:
    """Encode one array or a dict of named arrays (anything array-like becomes an array)."""
    if isinstance(value, Mapping):
        if len(value) > MAX_NAMED_TENSORS:
            raise ValidationError(f"at most {MAX_NAMED_TENSORS} named tensors are allowed")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"tensor names must be strings, got {key!r}")
            out[key] = encode_tensor(as_array(item))
        return out
    return encode_tensor(as_array(value))


def as_array(value: Any) -> Array:
    """Arrays pass through; Python lists of floats become float32, the usual model dtype."""
    if isinstance(value, np.ndarray):
        return value
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise ValidationError(f"inputs are not a tensor: {exc}") from exc
    if array.dtype == object or array.dtype.kind in "USV":
        raise ValidationError(f"inputs are not a tensor: they hold {array.dtype} values")
    return array.astype(np.float32) if array.dtype == np.float64 else array


def decode_tensors(obj: Any, where: str = "inputs") -> Tensors:
    """Decode one tensor map or a map of named tensor maps."""
    if is_tensor_map(obj):
        return decode_tensor(obj, where)
    if isinstance(obj, Mapping) and obj:
        if len(obj) > MAX_NAMED_TENSORS:
            raise ValidationError(f"{where}: at most {MAX_NAMED_TENSORS} named tensors")
        return {str(k): decode_tensor(v, f"{where}.{k}") for k, v in obj.items()}
    raise ValidationError(
        f"{where}: expected a tensor map {{dtype, shape, data}} or a map of named tensors, "
        f"got {type(obj).__name__}"
    )


def signature(value: Tensors) -> tuple[Any, ...]:
    """Hashable dtype-and-shape key: only requests with equal signatures share a batch."""
    if isinstance(value, dict):
        return tuple((k, v.dtype.str, v.shape) for k, v in sorted(value.items()))
    return (value.dtype.str, value.shape)
