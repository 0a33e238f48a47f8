"""The template encoder against the reference encoders: same bytes, same decoded request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfleet.schemas.envelopes import (
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.request_template import RequestTemplate, pack_inputs

pytestmark = pytest.mark.unit

_NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=40).filter(
    lambda s: s[0].isalnum())
_ID = st.text("abcdefABCDEF0123456789._:@-", min_size=1, max_size=128).filter(
    lambda s: s[0].isalnum())
_TIME = st.floats(min_value=0, max_value=4e9, allow_nan=False)
_DTYPES = ["float32", "float64", "int64", "int8", "uint8", "bool", ">f4", ">i8", "float16"]


@st.composite
def _inputs(draw: st.DrawFn) -> Any:
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    arr = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
    kind = draw(st.sampled_from(["array", "strided", "list", "named"]))
    if kind == "strided" and arr.ndim:
        return np.asfortranarray(arr)[..., ::-1]
    if kind == "list":
        return arr.astype(np.float64).tolist()
    if kind == "named":
        return {"a": arr, "b": np.ones(3, np.float32)}
    return arr


@st.composite
def _templates(draw: st.DrawFn) -> RequestTemplate:
    opt = st.none() | _ID
    return RequestTemplate(
        draw(_NAME), draw(st.sampled_from(["interactive", "bulk"])), notify=draw(opt),
        callback_url=draw(st.none() | st.just("https://hooks.example/cb")), owner=draw(opt),
        version=draw(st.none() | _NAME), routing_key=draw(st.none() | st.text(min_size=1,
                                                                              max_size=20)),
        cache=draw(st.booleans()))


def _same_request(a: Request, b: Request) -> None:
    fields = ("request_id", "model", "lane", "enqueued_at", "deadline_at", "callback_url",
              "notify", "attempt", "generation", "history", "owner", "version", "routing_key",
              "traceparent", "cache")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    if isinstance(a.inputs, dict):
        assert isinstance(b.inputs, dict) and a.inputs.keys() == b.inputs.keys()
        for key, value in a.inputs.items():
            np.testing.assert_array_equal(value, b.inputs[key])
            assert value.dtype == b.inputs[key].dtype
    else:
        assert not isinstance(b.inputs, dict)
        np.testing.assert_array_equal(a.inputs, b.inputs)
        assert a.inputs.dtype == b.inputs.dtype


@settings(max_examples=300, deadline=None)
@given(_templates(), _ID, _TIME, st.none() | _TIME, _inputs(),
       st.none() | st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
def test_template_bytes_decode_as_the_reference_encoding(
        template: RequestTemplate, rid: str, at: float, deadline: float | None, inputs: Any,
        traceparent: str | None) -> None:
    fast = template.encode(rid, at, inputs, deadline, traceparent)
    reference = encode_request(template.request(rid, at, inputs, deadline, traceparent))
    assert fast == reference
    _same_request(decode_request(fast), decode_request(reference))
    pending = Result(rid, "pending", model=template.model, enqueued_at=at, owner=template.owner)
    assert template.pending(rid, at) == encode_result(pending)
    assert decode_result(template.pending(rid, at)) == decode_result(encode_result(pending))


def test_a_warm_shape_is_packed_like_a_cold_one() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert pack_inputs(arr) == pack_inputs(arr.copy())  # the second from the cached head


@pytest.mark.parametrize("bad", [{"model": "bad name!"}, {"lane": "nope"},
                                 {"owner": "has space"}, {"version": "@x"},
                                 {"routing_key": ""}, {"notify": "a b"}])
def test_constant_fields_are_validated_once_at_build(bad: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"model": "demo-mlp", "lane": "interactive", **bad}
    with pytest.raises(ValidationError):
        RequestTemplate(kw.pop("model"), kw.pop("lane"), **kw)


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), [[1.0], [1.0, 2.0]],
                                 np.zeros((1,) * 9, np.float32), np.array([1 + 2j])])
def test_bad_inputs_raise_as_encode_request_does(bad: Any) -> None:
    template = RequestTemplate("demo-mlp", "interactive")
    with pytest.raises(ValidationError):
        encode_request(template.request("r-1", 1.0, bad))
    with pytest.raises(ValidationError):
        template.encode("r-1", 1.0, bad)
