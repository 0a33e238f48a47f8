from __future__ import annotations

import msgpack
import numpy as np
import pytest

from batchfleet.schemas import (
    ErrorInfo,
    Limits,
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import DecodeError, LimitExceededError, ValidationError

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


def _raw(**fields: object) -> bytes:
    """A request as a non-Python producer might send it: any value in any field."""
    body = {"v": 1, "id": "r-1", "model": "demo-mlp", "lane": "interactive",
            "enqueued_at": 1.5, "deadline_at": None, "callback_url": None, "notify": None,
            "attempt": 1, "generation": 0, "errors": [],
            "inputs": {"dtype": "float32", "shape": [1], "data": b"\0" * 4}}
    return msgpack.packb({**body, **fields}, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("field", "value"), [
    ("generation", 2**53),  # one past what Lua compares exactly
    ("generation", 2**64 - 1),  # was read as -1 by the result-write script
    ("generation", -1),
    ("generation", 1.0),
    ("generation", True),
    ("attempt", 2**53),
    ("attempt", -1),
    ("attempt", "2"),
    ("enqueued_at", float("inf")),
    ("enqueued_at", float("nan")),
    ("enqueued_at", "now"),
    ("deadline_at", float("-inf")),
    ("deadline_at", True),
    ("lane", "urgent"),
    ("lane", 3),
    ("notify", "a b"),
    ("callback_url", 7),
    ("errors", {"attempt": 1}),
])
def test_out_of_range_fields_are_validation_errors_naming_the_field(
        field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        decode_request(_raw(**{field: value}))


@pytest.mark.parametrize(("field", "value", "read"), [
    ("generation", 2**53 - 1, 2**53 - 1),
    ("generation", 0, 0),
    ("attempt", 2**53 - 1, 2**53 - 1),
    ("attempt", 0, 1),  # 0 is read as 1
    ("deadline_at", 1e12, 1e12),
])
def test_edge_values_in_range_are_accepted(field: str, value: object, read: object) -> None:
    assert getattr(decode_request(_raw(**{field: value})), field) == read


def test_a_generation_out_of_lua_range_is_stored_as_zero() -> None:
    from batchfleet.schemas.envelopes import MAX_EXACT_INT, lua_exact_generation

    assert [lua_exact_generation(g) for g in (0, 7, MAX_EXACT_INT, MAX_EXACT_INT + 1,
                                                2**64 - 1, -1, True, "3", None)] == [
        0, 7, MAX_EXACT_INT, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("field", ["attempt", "generation"])
def test_encoding_refuses_integers_lua_cannot_compare(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        encode_request(_request(**{field: 2**53}))
