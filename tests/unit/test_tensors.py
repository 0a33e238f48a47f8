from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.tensors import (
    DTYPES,
    decode_tensor,
    decode_tensors,
    encode_tensor,
    encode_tensors,
)

pytestmark = pytest.mark.unit

dtypes = st.sampled_from(sorted(DTYPES)).map(np.dtype)
arrays = hnp.arrays(dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))


@given(arrays)
def test_round_trip_preserves_dtype_shape_and_bits(array: np.ndarray) -> None:
    wire = msgpack.packb(encode_tensor(array), use_bin_type=True)
    back = decode_tensor(msgpack.unpackb(wire, raw=False))
    assert back.dtype == array.dtype.newbyteorder("<")
    assert back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(array).astype(back.dtype).tobytes()


@given(st.dictionaries(st.text(min_size=1, max_size=8), arrays, min_size=1, max_size=4))
def test_named_tensors_round_trip(named: dict[str, np.ndarray]) -> None:
    back = decode_tensors(msgpack.unpackb(msgpack.packb(encode_tensors(named)), raw=False))
    assert isinstance(back, dict)
    assert set(back) == set(named)
    for key, value in named.items():
        assert back[key].shape == value.shape


def test_decode_is_zero_copy_view_of_the_bytes() -> None:
    data = np.arange(6, dtype=np.float32).tobytes()
    arr = decode_tensor({"dtype": "float32", "shape": [2, 3], "data": data})
    assert not arr.flags.writeable  # a view over the immutable bytes, not a copy
    assert arr.base is not None


def test_big_endian_input_is_swapped_to_little_endian() -> None:
    arr = np.array([1.5, -2.0], dtype=">f4")
    enc = encode_tensor(arr)
    assert enc["data"] == np.array([1.5, -2.0], dtype="<f4").tobytes()


def test_python_float_lists_become_float32() -> None:
    assert encode_tensors([0.5, 1.0])["dtype"] == "float32"
    assert encode_tensors([1, 2])["dtype"] == "int64"


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"dtype": "complex64", "shape": [1], "data": b"\0" * 8}, "not supported"),
        ({"dtype": "float32", "shape": [3], "data": b"\0" * 8}, "needs 12 bytes, got 8"),
        ({"dtype": "float32", "shape": [-1], "data": b""}, "non-negative"),
        ({"dtype": "float32", "shape": [1] * 9, "data": b"\0" * 4}, "at most 8"),
        ({"dtype": "float32", "shape": [1], "data": "text"}, r"'data' \(bytes\)"),
        ("just a string", "expected a tensor map"),
    ],
)
def test_bad_tensors_are_refused_with_a_reason(obj: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        decode_tensors(obj)


def test_object_and_string_inputs_are_not_tensors() -> None:
    with pytest.raises(ValidationError, match="not a tensor"):
        encode_tensors([[1, 2], [3]])
    with pytest.raises(ValidationError, match="not a tensor"):
        encode_tensors(["a", "b"])
