"""The batch decoder against the single-request decoder: same requests, arrays and errors.

Envelopes are drawn with every field either usual, absent or odd (wrong type, out of
range, nil), some tensors wrong, and some bytes truncated or overwritten, so both the
common path and every fallback to the single-request decoder are exercised.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.batch_decode import decode_batch, decode_common, row_runs
from batchfleet.schemas.envelopes import DEFAULT_LIMITS, Limits, Request, decode_request
from batchfleet.schemas.errors import DecodeError, SchemaError
from batchfleet.schemas.tensors import DTYPES
from batchfleet.workers.intake import Intake, _decode_one, decode_deliveries
from batchfleet.workers.models.handler import TensorSpec, TorchModuleHandler
from batchfleet.workers.models.staging import PinnedStaging
from tests.support.wire_maps import ABSENT, packed_map

pytestmark = pytest.mark.unit

ODD = st.sampled_from([None, True, False, 0, 1, -1, 2**53, 2**64 - 1, 1.5, -0.0,
                       float("nan"), float("inf"), "", "x", "bulk", "interactive", "c-1",
                       "bad name", [], [{}], [1], {}, {1: "x"}, b"bin"])
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
#: Each field's usual values (ABSENT: usually not sent).
USUAL: dict[str, st.SearchStrategy[Any]] = {
    "v": st.just(1),
    "id": st.from_regex(r"[a-z0-9:@-]{1,12}", fullmatch=True),
    "model": st.sampled_from(["demo-mlp", "demo-mlp", "other"]),
    "lane": st.sampled_from(["interactive", "bulk", ABSENT]),
    "enqueued_at": st.one_of(st.floats(0, 2e9), st.none()),
    "deadline_at": st.one_of(st.none(), st.floats(0, 3e9)),
    "callback_url": st.one_of(st.none(), st.just("https://x.example/cb")),
    "notify": st.sampled_from([None, "c-1", "c-2", ""]),
    "attempt": st.integers(0, 5),
    "generation": st.integers(0, 5),
    "errors": st.sampled_from([[], [{"attempt": 1}], None]),
    "owner": st.sampled_from([ABSENT, ABSENT, "k1", None]),
    "version": st.sampled_from([ABSENT, ABSENT, "v2", None]),
    "routing_key": st.sampled_from([ABSENT, ABSENT, "u"]),
    "traceparent": st.sampled_from([ABSENT, ABSENT, TRACEPARENT, "00-bad"]),
    "cache": st.sampled_from([ABSENT, ABSENT, False, True, None]),
}


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    name = draw(st.sampled_from(["float32", "float32", "int64", "uint8", "bool", "float16"]))
    shape = draw(st.sampled_from([[3], [3], [2, 2], [], [0], [1, 3]]))
    size = int(np.prod(shape, dtype=np.int64)) * DTYPES[name].itemsize
    data = draw(st.binary(min_size=size, max_size=size))
    kind = draw(st.integers(0, 14))
    if kind == 0:  # wrong byte count
        data += b"\x00"
    elif kind == 1:
        name = draw(st.sampled_from(["bfloat16", "complex64"]))
    elif kind == 2:
        shape = draw(st.sampled_from([[3.0], [True], [-1], "3", None]))  # type: ignore[list-item]
    elif kind == 3:
        return {"a": {"dtype": name, "shape": shape, "data": data}}  # named tensors
    elif kind == 4:
        return draw(ODD)
    elif kind == 5:
        return {"dtype": name, "shape": shape, "data": data.decode("latin-1")}  # str, not bin
    elif kind == 6:  # a key more: not a string (msgpack refuses it), or an unknown one
        return {"dtype": name, "shape": shape, "data": data,
                draw(st.sampled_from([7, "extra"])): 1}
    return {"dtype": name, "shape": shape, "data": data}


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """Mostly valid envelopes; some with a field or two absent or odd, some damaged."""
    return packed_map(draw, USUAL, ODD, inputs=draw(tensors()))


def assert_same_array(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_array(a[key], b[key])
        return
    assert (a.dtype.str, a.shape, a.flags.writeable) == (b.dtype.str, b.shape, b.flags.writeable)
    assert a.tobytes() == b.tobytes()


def assert_same_request(a: Request, b: Request) -> None:
    for name in Request.__slots__:
        if name == "inputs":
            assert_same_array(a.inputs, b.inputs)
        else:
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and (x == y or (x, y) == (x, x)), name  # NaN: identity


def assert_same_error(a: BaseException, b: BaseException) -> None:
    assert type(a) is type(b) and str(a) == str(b)
    if isinstance(a, DecodeError):
        assert isinstance(b, DecodeError)
        assert (a.raw, a.request_id) == (b.raw, b.request_id)


def single(raw: bytes, limits: Limits = DEFAULT_LIMITS) -> Request | SchemaError:
    try:
        return decode_request(raw, limits)
    except SchemaError as exc:
        return exc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(), max_size=12), st.sampled_from([DEFAULT_LIMITS, Limits(200)]),
       st.booleans())
def test_a_batch_decodes_exactly_as_its_requests_do_one_by_one(
        payloads: list[bytes], limits: Limits, native: bool) -> None:
    """Both common paths (msgspec's typed decoding, and msgpack with checks in Python)."""
    common = decode_common(payloads, limits, native)
    for raw, fast, got in zip(payloads, common, decode_batch(payloads, limits), strict=True):
        if fast is not None:
            assert_same_request(fast, single(raw, limits))  # type: ignore[arg-type]
        want = single(raw, limits)
        if isinstance(want, SchemaError):
            assert fast is None
            assert isinstance(got, SchemaError)
            assert_same_error(got, want)
        else:
            assert isinstance(got, Request)
            assert_same_request(got, want)


@pytest.mark.parametrize("native", [True, False])
def test_usual_envelopes_take_the_common_path(native: bool) -> None:
    """The common path is taken, not only agreed with: an SDK envelope, one with an
    integer timestamp, a tenant, a version and a trace decode there."""
    from batchfleet.schemas.envelope_struct import envelope_decoder
    from batchfleet.schemas.envelopes import encode_request

    assert envelope_decoder() is not None  # msgspec is a dependency
    plain = Request("r-1", "demo-mlp", np.arange(3, dtype=np.float32), enqueued_at=5.5)
    full = Request("r-2", "demo-mlp", np.arange(3, dtype=np.float32), owner="k1",
                   version="v2", traceparent=TRACEPARENT, enqueued_at=6.0)
    wire = msgpack.unpackb(encode_request(plain), raw=False)
    wire["enqueued_at"] = 7
    payloads = [encode_request(plain), encode_request(full)]
    if native:  # msgpack's path leaves an integer timestamp to the single-request decoder
        payloads.append(msgpack.packb(wire))
    got = decode_common(payloads, DEFAULT_LIMITS, native)
    assert all(isinstance(r, Request) for r in got)
    for raw, fast in zip(payloads, got, strict=True):
        assert_same_request(fast, decode_request(raw))  # type: ignore[arg-type]


def _handler() -> TorchModuleHandler:
    def refuse_big(inputs: Any) -> None:
        if np.any(np.asarray(inputs) > 1e6):
            raise ValueError("too big")
    return TorchModuleHandler("demo-mlp", torch.nn.Identity(), version="v",
                              input_spec=TensorSpec("float32", (3,)), validator=refuse_big)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(envelopes(), st.sampled_from(["demo-mlp", "demo-mlp@v2", "other"])),
                max_size=10))
def test_intake_answers_a_fetch_as_it_would_each_delivery_alone(
        items: list[tuple[bytes, str]]) -> None:
    handlers = {"demo-mlp": _handler()}
    deliveries = [Delivery(lane, "interactive", raw, i) for i, (raw, lane) in enumerate(items)]
    now = 1.7e9
    got = decode_deliveries(deliveries, handlers, now=now)
    want = Intake()
    for delivery in deliveries:
        _decode_one(delivery, handlers, DEFAULT_LIMITS, now, want)
    assert [j.delivery for j in got.jobs] == [j.delivery for j in want.jobs]
    for a, b in zip(got.jobs, want.jobs, strict=True):
        assert_same_request(a.request, b.request)
    assert len(got.answers) == len(want.answers)
    for x, y in zip(got.answers, want.answers, strict=True):
        assert x.delivery is y.delivery
        assert (x.notify, x.generation, x.callback_url) == (y.notify, y.generation, y.callback_url)
        assert (x.result.outputs, y.result.outputs) == (None, None)
        assert x.result == y.result or x.result.enqueued_at != x.result.enqueued_at  # NaN
    assert got.undecodable == want.undecodable


def _rows(n: int) -> list[np.ndarray[Any, Any]]:
    raws = [msgpack.packb({"v": 1, "id": f"r{i}", "model": "m", "inputs": {
        "dtype": "float32", "shape": [3], "data": np.full(3, i, np.float32).tobytes()}})
        for i in range(n)]
    decode_common(raws)  # warms the spec cache
    requests = decode_common(raws)
    assert all(r is not None for r in requests)
    return [r.inputs for r in requests]  # type: ignore[union-attr,misc]


@given(st.integers(1, 8), st.integers(1, 8), st.data())
def test_stacking_rows_of_blocks_equals_np_stack_and_never_mistakes_others(
        n: int, m: int, data: st.DataObject) -> None:
    rows = _rows(n) + _rows(m)  # two fetches
    picks = data.draw(st.lists(st.integers(0, n + m - 1), min_size=1, max_size=n + m))
    chosen = [rows[i] for i in picks]
    runs = row_runs(chosen)
    assert runs is not None
    np.testing.assert_array_equal(np.concatenate(runs), np.stack(chosen))
    if picks == list(range(picks[0], picks[0] + len(picks))) and picks[-1] < n:
        assert len(runs) == 1  # one fetch, in order: one piece
    for staging in (PinnedStaging(16), PinnedStaging(1)):
        staged = staging.stack(chosen)
        np.testing.assert_array_equal(staged.numpy(), np.stack(chosen))
        staged.numpy()[:] = -1  # the batch is a copy: the requests' own arrays are untouched
    assert [float(r[0]) for r in rows] == [*range(n), *range(m)]


def test_look_alike_arrays_are_not_taken_for_rows() -> None:
    rows = _rows(3)
    copies = [r.copy() for r in rows]
    assert row_runs(copies) is None
    assert row_runs([rows[0], rows[1], copies[2]]) is None
    assert row_runs([rows[0], rows[1][:], rows[2]]) is None  # a view of a row, not a row
    assert row_runs([]) == []
