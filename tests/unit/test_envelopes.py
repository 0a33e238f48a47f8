from __future__ import annotations

import msgpack
import numpy as np
import pytest

from schemas import (
    ErrorInfo,
    Limits,
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from schemas.errors import DecodeError, LimitExceededError, ValidationError

pytestmark = pytest.mark.unit


def _request(**kw: object) -> Request:
    base = {"request_id": "r-1", "model": "demo-mlp",
            "inputs": np.arange(10, dtype=np.float32), "enqueued_at": 1.5}
    return Request(**{**base, **kw})  # type: ignore[arg-type]


def test_request_round_trip() -> None:
    req = _request(deadline_at=9.0, callback_url="https://x.example/cb", notify="c1",
                   lane="bulk", attempt=2, generation=3)
    back = decode_request(encode_request(req))
    assert back.request_id == "r-1" and back.model == "demo-mlp" and back.lane == "bulk"
    assert back.deadline_at == 9.0 and back.notify == "c1" and back.callback_url
    assert (back.attempt, back.generation) == (2, 3)
    np.testing.assert_array_equal(back.inputs, req.inputs)


def test_result_round_trip_with_error() -> None:
    res = Result("r-1", "failed", error=ErrorInfo("model_error", "boom", True), model="m",
                 attempts=3, enqueued_at=1.0, batch_size=4)
    back = decode_result(encode_result(res))
    assert back.status == "failed" and back.error == res.error and back.attempts == 3


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", b"garbage bytes", msgpack.packb([1, 2, 3]),
     encode_request(_request())[:-5]],
    ids=["empty", "reserved-byte", "garbage", "not-a-map", "truncated"],
)
def test_undecodable_bytes_raise_decode_error_keeping_the_raw_bytes(raw: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_request(raw)
    assert info.value.raw == raw


def test_oversized_message_is_refused_before_unpacking() -> None:
    raw = encode_request(_request(inputs=np.zeros(1000, dtype=np.float32)))
    with pytest.raises(LimitExceededError, match="limit is 100"):
        decode_request(raw, Limits(max_message_bytes=100))


def test_wrong_schema_version_names_the_request() -> None:
    raw = msgpack.packb({"v": 99, "id": "r-9", "model": "m"})
    with pytest.raises(DecodeError, match="schema version 99") as info:
        decode_request(raw)
    assert info.value.request_id == "r-9"


def test_missing_id_is_a_decode_error_and_bad_fields_are_validation_errors() -> None:
    with pytest.raises(DecodeError, match="no valid 'id'"):
        decode_request(msgpack.packb({"v": 1, "model": "m"}))
    with pytest.raises(ValidationError, match="lane"):
        decode_request(msgpack.packb({"v": 1, "id": "a", "model": "m", "lane": "vip",
                                      "inputs": {"dtype": "int8", "shape": [0], "data": b""}}))
    with pytest.raises(ValidationError, match="expected a tensor map"):
        decode_request(msgpack.packb({"v": 1, "id": "a", "model": "m", "inputs": "hello"}))


def test_invalid_ids_and_model_names_are_refused_at_encode() -> None:
    with pytest.raises(ValidationError, match="request_id"):
        encode_request(_request(request_id="has space"))
    with pytest.raises(ValidationError, match="model name"):
        encode_request(_request(model="bad/name"))
