"""Result envelopes from a batch template read back exactly as ``encode_result``'s do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfleet.schemas.envelopes import ErrorInfo, Result, decode_result, encode_result
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.result_template import encode_results

pytestmark = pytest.mark.unit

FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([0.0, -0.0, 0]))
DTYPES = ["float32", "float32", ">f4", "int64", "bool", "float16", "uint8", "complex64"]


@st.composite
def batches(draw: st.DrawFn) -> list[Result]:
    """The results of a batch or two: shared fields, per-request ones, and odd ones out."""
    results: list[Result] = []
    for _ in range(draw(st.integers(1, 2))):
        shared = {"model": draw(st.sampled_from(["demo-mlp", "m"])),
                  "model_version": draw(st.sampled_from(["default/sha256:abc", ""])),
                  "started_at": draw(st.one_of(FLOATS, st.none())),
                  "finished_at": draw(st.one_of(FLOATS, st.none())),
                  "compute_ms": draw(st.one_of(FLOATS, st.none())),
                  "batch_size": draw(st.one_of(st.integers(0, 2**40), st.none()))}
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        n = draw(st.integers(1, 6))
        block = np.frombuffer(draw(st.binary(min_size=n * int(np.prod(shape)) * dtype.itemsize,
                                             max_size=n * int(np.prod(shape)) * dtype.itemsize)),
                              dtype=dtype).reshape(n, *shape)
        for i in range(n):
            outputs: Any = block[i]
            kind = draw(st.integers(0, 9))
            if kind == 0:
                outputs = {"a": block[i], "b": block[i]}
            elif kind == 1:
                outputs = np.zeros((1,) * 9, np.float32)  # too many dimensions: refused
            status, error = "succeeded", None
            if kind == 2:
                status, error, outputs = "failed", ErrorInfo("model_error", "boom", True), None
            # equal values in new objects, as results written apart (a cache hit) carry
            fields = dict(shared) if draw(st.booleans()) else {
                k: v if v is None else type(v)(repr(v)) for k, v in shared.items()}
            results.append(Result(
                draw(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)), status, outputs, error,
                attempts=draw(st.integers(0, 2**53 - 1)), enqueued_at=draw(FLOATS),
                queue_ms=draw(st.one_of(FLOATS, st.none())),
                generation=draw(st.integers(0, 2**53 - 1)),
                owner=draw(st.sampled_from([None, "k1"])), cached=draw(st.booleans()),
                **fields))
    return results


def one_by_one(results: list[Result]) -> list[bytes | type[BaseException]]:
    out: list[bytes | type[BaseException]] = []
    for res in results:
        try:
            out.append(encode_result(res))
        except ValidationError as exc:
            out.append(type(exc))
    return out


def assert_same_result(a: Result, b: Result) -> None:
    for name in Result.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if name == "outputs" and x is not None:
            xs, ys = (x, y) if isinstance(x, dict) else ({"": x}, {"": y})
            assert xs.keys() == ys.keys()
            for key in xs:
                assert (xs[key].dtype, xs[key].shape) == (ys[key].dtype, ys[key].shape)
                assert xs[key].tobytes() == ys[key].tobytes()
        else:
            assert x == y, name


@settings(max_examples=300, deadline=None)
@given(batches())
def test_template_bodies_are_the_bytes_encode_result_writes(results: list[Result]) -> None:
    want = one_by_one(results)
    if any(isinstance(w, type) for w in want):  # encode_result refuses one: so must the batch
        with pytest.raises(ValidationError):
            encode_results(results)
        results = [r for r, w in zip(results, want, strict=True) if not isinstance(w, type)]
        want = one_by_one(results)
    got = encode_results(results)
    for body, expected in zip(got, want, strict=True):
        assert isinstance(expected, bytes)
        assert_same_result(decode_result(body), decode_result(expected))
        assert body == expected


def test_a_batch_shares_one_template_and_reads_back_per_request_fields() -> None:
    out = np.arange(6, dtype=np.float32).reshape(3, 2)
    started, finished, compute = 10.0, 10.5, 500.0
    results = [Result(f"r{i}", "succeeded", out[i], model="m", model_version="v", attempts=1,
                      enqueued_at=9.0 + i, started_at=started, finished_at=finished,
                      queue_ms=1000.0 - i, compute_ms=compute, batch_size=3, generation=i,
                      owner="k1" if i == 1 else None, cached=i == 2)
               for i in range(3)]
    for res, body in zip(results, encode_results(results), strict=True):
        back = decode_result(body)
        assert (back.request_id, back.queue_ms, back.generation, back.owner, back.cached) == (
            res.request_id, res.queue_ms, res.generation, res.owner, res.cached)
        np.testing.assert_array_equal(back.outputs, res.outputs)  # type: ignore[arg-type]


def test_equal_values_that_pack_apart_get_templates_of_their_own() -> None:
    """0 and 0.0, 0.0 and -0.0 compare equal but are different bytes on the wire."""
    out = np.zeros((4, 1), np.float32)
    results = [Result(f"r{i}", "succeeded", out[i], model="m", started_at=started,
                      finished_at=1.0, compute_ms=compute, batch_size=4)
               for i, (started, compute) in enumerate([(0.0, 0), (0.0, 0.0), (-0.0, 0.0),
                                                       (-0.0, 0)])]
    assert encode_results(results) == [encode_result(r) for r in results]
