"""The one strict check for names, IDs and shapes: a table, and the two reproductions."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from batchfleet.schemas.envelopes import Request, decode_request, encode_request
from batchfleet.schemas.errors import DecodeError, ValidationError
from batchfleet.schemas.tensors import decode_tensor
from batchfleet.schemas.validation import (
    check_key_id,
    check_model_name,
    check_notify,
    check_request_id,
    check_shape,
)

pytestmark = pytest.mark.unit

_BAD_EVERYWHERE: list[Any] = [
    "", "wf-nl\n", "\nwf", "a\r", "a\x00b", "a\tb", "a b", "a,b", "a/b", "a*", "caf\u00e9",
    "\u0661\u0662", "a\u2028", "x\x7f", None, 5, b"abc", ["a"],
]


@pytest.mark.parametrize("check", [check_request_id, check_model_name, check_notify,
                                   check_key_id])
@pytest.mark.parametrize("value", _BAD_EVERYWHERE)
def test_control_characters_and_odd_values_are_refused_by_every_check(check: Any,
                                                                     value: Any) -> None:
    with pytest.raises(ValidationError):
        check(value)


@pytest.mark.parametrize(("check", "good", "bad"), [
    (check_request_id, ["r1", "a" * 128, "gw-1:2@x.y_z", "-", "..."],
     ["a" * 129, "a#b", "a%0A"]),
    (check_notify, ["0123abcd", "c:1@h"], ["a" * 129]),
    (check_model_name, ["demo-mlp", "m", "A.b_c-1", "x" * 64],
     ["-m", ".m", "_m", "x" * 65, "m:1", "m@1"]),
    (check_key_id, ["default", "team.a_b-1", "k" * 64], ["k" * 65, "a:b", "a@b"]),
])
def test_name_grammar_table(check: Any, good: list[str], bad: list[str]) -> None:
    for value in good:
        assert check(value) == value
    for value in bad:
        with pytest.raises(ValidationError):
            check(value)


@pytest.mark.parametrize("shape", [[10.0], [True], [-1], [1, 2.5], "10", None, {"a": 1},
                                   [1] * 9, [2**31], [10, None]])
def test_bad_shapes_are_refused(shape: Any) -> None:
    with pytest.raises(ValidationError):
        check_shape(shape)


def test_good_shapes_pass() -> None:
    assert check_shape([]) == ()
    assert check_shape((2, 10)) == (2, 10)
    assert check_shape([0, 2**31 - 1]) == (0, 2**31 - 1)


def test_a_trailing_newline_id_is_refused_on_encode_and_decode() -> None:
    """Reproduction: ``wf-nl\\n`` used to pass (``re``'s ``$`` matches before a newline)."""
    with pytest.raises(ValidationError):
        encode_request(Request("wf-nl\n", "demo-mlp", np.zeros(10, np.float32)))
    with pytest.raises(ValidationError):
        encode_request(Request("wf-nl", "demo-mlp\n", np.zeros(10, np.float32)))
    with pytest.raises(ValidationError):
        encode_request(Request("wf-nl", "demo-mlp", np.zeros(10, np.float32), notify="c1\n"))
    good = msgpack.unpackb(encode_request(Request("wf-nl", "demo-mlp", np.zeros(10, np.float32))))
    for field, value in [("model", "demo-mlp\n"), ("notify", "c1\n")]:
        with pytest.raises(ValidationError):
            decode_request(msgpack.packb({**good, field: value}))
    with pytest.raises(DecodeError, match="no valid 'id'"):
        decode_request(msgpack.packb({**good, "id": "wf-nl\n"}))


@pytest.mark.parametrize(("shape", "twin"), [([10.0], [10]), ([True] * 8, [1] * 8),
                                             ([10, 1.0], [10, 1])])
def test_a_float_or_bool_shape_is_refused_on_a_cold_and_a_warm_cache(shape: list[Any],
                                                                      twin: list[int]) -> None:
    """Reproduction: ``[10.0]`` hashed like ``[10]``, so a warm shape cache let it through."""
    data = b"\0" * (4 * (10 if 10 in twin else 1))
    with pytest.raises(ValidationError):  # cold (or whatever state the cache is in)
        decode_tensor({"dtype": "float32", "shape": shape, "data": data})
    assert decode_tensor({"dtype": "float32", "shape": twin, "data": data}).shape == \
        tuple(twin)  # now warm
    with pytest.raises(ValidationError):
        decode_tensor({"dtype": "float32", "shape": shape, "data": data})


def test_an_empty_notify_means_no_announcement_as_the_wire_format_says() -> None:
    good = msgpack.unpackb(encode_request(Request("r1", "demo-mlp", np.zeros(10, np.float32))))
    assert decode_request(msgpack.packb({**good, "notify": ""})).notify is None
    assert decode_request(msgpack.packb({**good, "notify": "c0ffee"})).notify == "c0ffee"


def test_the_sdks_request_ids_are_32_random_hex_characters_that_pass_the_grammar() -> None:
    from batchfleet.producers.client import new_request_id

    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000  # 128 random bits: no repeat in practice
    for rid in list(ids)[:100]:
        assert len(rid) == 32 and int(rid, 16) >= 0
        assert check_request_id(rid) == rid
