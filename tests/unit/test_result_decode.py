"""The callers' result decoder against the full one: the same Result for every message
its typed path accepts, and the same error for every message it refuses.

Result maps are drawn with every field usual, absent or odd (wrong type, out of range,
nil, a map with a key that is not a string), some tensors wrong, and some bytes truncated
or overwritten, so the typed path and each way back to the full decoder are exercised.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchfleet.schemas import envelopes
from batchfleet.schemas.envelope_struct import result_decoder
from batchfleet.schemas.envelopes import DEFAULT_LIMITS, Limits, Result, encode_result
from batchfleet.schemas.result_decode import decode_result, typed_result
from tests.support.wire_maps import ABSENT, packed_map

pytestmark = pytest.mark.unit

ODD = st.sampled_from([None, True, False, 0, 1, -1, 2**64 - 1, 1.5, -0.0, float("nan"),
                       float("inf"), "", "x", "succeeded", "bad id", [], [{}], {},
                       {1: "x"}, {"type": "t"}, b"bin"])
USUAL: dict[str, st.SearchStrategy[Any]] = {
    "v": st.just(1),
    "id": st.from_regex(r"[a-z0-9:@-]{1,12}", fullmatch=True),
    "status": st.sampled_from(["succeeded", "succeeded", "failed", "expired", "nope"]),
    "error": st.sampled_from([None, None, {"type": "x", "message": "m"}]),
    "model": st.sampled_from(["demo-mlp", ABSENT]),
    "model_version": st.sampled_from(["default", "v2", ABSENT]),
    "attempts": st.integers(0, 3),
    "enqueued_at": st.one_of(st.floats(0, 2e9), st.none()),
    "started_at": st.one_of(st.floats(0, 2e9), st.none()),
    "finished_at": st.one_of(st.floats(0, 2e9), st.none()),
    "queue_ms": st.one_of(st.floats(0, 100), st.none()),
    "compute_ms": st.one_of(st.floats(0, 100), st.none()),
    "batch_size": st.one_of(st.integers(1, 256), st.none()),
    "generation": st.integers(0, 3),
    "owner": st.sampled_from([ABSENT, ABSENT, "k1", None]),
    "cached": st.sampled_from([ABSENT, ABSENT, True]),
    "degraded": st.sampled_from([ABSENT, ABSENT, True]),
    "degraded_reason": st.sampled_from([ABSENT, "breaker_open", None]),
    "fallback": st.sampled_from([ABSENT, "value", None]),
    "degraded_error": st.sampled_from([ABSENT, None, {"type": "x"}]),
    "steps": st.sampled_from([ABSENT, ABSENT, None, [{"model": "a"}]]),
}


@st.composite
def outputs(draw: st.DrawFn) -> Any:
    name = draw(st.sampled_from(["float32", "float32", "int64", "bool"]))
    shape = draw(st.sampled_from([[2], [2], [1, 2], [], [0]]))
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(name).itemsize
    data = draw(st.binary(min_size=size, max_size=size))
    kind = draw(st.integers(0, 10))
    if kind == 0:
        data += b"\x00"  # wrong byte count
    elif kind == 1:
        return {"a": {"dtype": name, "shape": shape, "data": data}}  # named tensors
    elif kind == 2:
        return draw(ODD)
    elif kind == 3:
        return {"dtype": name, "shape": shape, "data": data, draw(st.sampled_from([7, "x"])): 1}
    elif kind == 4:
        return None
    return {"dtype": name, "shape": shape, "data": data}


@st.composite
def result_maps(draw: st.DrawFn) -> bytes:
    return packed_map(draw, USUAL, ODD, outputs=draw(outputs()))


def _outcome(decode: Any, raw: bytes, limits: Limits) -> Result | BaseException:
    try:
        result: Result = decode(raw, limits)
        return result
    except Exception as exc:  # the full decoder's errors are part of the contract
        return exc


def assert_same_outputs(x: Any, y: Any) -> None:
    assert type(x) is type(y)
    if isinstance(x, dict):  # named tensors
        assert x.keys() == y.keys()
        for key in x:
            assert_same_outputs(x[key], y[key])
    elif x is not None:
        assert (x.dtype.str, x.shape, x.flags.writeable) == (
            y.dtype.str, y.shape, y.flags.writeable)
        assert x.tobytes() == y.tobytes()


def assert_same_result(a: Result, b: Result) -> None:
    for f in fields(Result):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "outputs":
            assert_same_outputs(x, y)
        else:
            assert type(x) is type(y) and (x == y or (x, y) == (x, x)), f.name  # NaN


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result_maps(), st.sampled_from([DEFAULT_LIMITS, Limits(120)]))
def test_the_typed_path_gives_what_the_full_decoder_gives(raw: bytes, limits: Limits) -> None:
    got, want = _outcome(decode_result, raw, limits), _outcome(envelopes.decode_result, raw,
                                                               limits)
    if isinstance(want, BaseException):
        assert type(got) is type(want) and str(got) == str(want)
    else:
        assert isinstance(got, Result)
        assert_same_result(got, want)


def test_usual_results_take_the_typed_path() -> None:
    """Taken, not only agreed with: a plain, a cached and a tenant's result."""
    decode = result_decoder()
    assert decode is not None  # msgspec is installed with the worker extra and the tests
    base = dict(request_id="r-1", status="succeeded", outputs=np.arange(2, dtype=np.float32),
                model="demo-mlp", model_version="default", attempts=1, enqueued_at=5.0,
                started_at=5.1, finished_at=5.2, queue_ms=1.0, compute_ms=2.0, batch_size=8)
    for extra in ({}, {"cached": True}, {"owner": "k1"}):
        raw = encode_result(Result(**{**base, **extra}))  # type: ignore[arg-type]
        fast = typed_result(decode(raw))
        assert fast is not None
        assert_same_result(fast, envelopes.decode_result(raw))
