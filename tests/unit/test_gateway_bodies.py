"""Submit bodies (``producers/gateway/bodies.py``): every wrong kind of value for a field
is a ``ValidationError`` naming it (the gateway's 422), never another exception (a 500)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from batchfleet.producers.gateway.bodies import decode_body, parse_submission
from batchfleet.schemas.errors import ValidationError

pytestmark = pytest.mark.unit

ODD: list[Any] = [[], {}, ["float32"], {"a": 1}, True, 1, 1.5, -1, None, "", "x" * 300]
#: (field, the start of its message, values it accepts)
FIELDS: list[tuple[str, str, list[Any]]] = [
    ("dtype", "dtype must be one of", ["float32", None]),
    ("priority", "priority must be one of", ["bulk"]),
    ("deadline_s", "deadline_s must be a positive number", [1, 1.5, None]),
    ("cache", "cache must be true, false or null", [True, False, None]),
    ("callback_url", "callback_url must be a string", ["", "x" * 300, None]),
    ("routing_key", "routing_key must be a string", ["x", None]),
    ("version", "version must be a label", ["v2", None]),
]


@pytest.mark.parametrize(("field", "message", "good"), FIELDS, ids=[f for f, _, _ in FIELDS])
@pytest.mark.parametrize("media", ["application/json", "application/msgpack"])
def test_every_odd_value_of_every_field_is_a_validation_error(
        field: str, message: str, good: list[Any], media: str) -> None:
    for value in ODD:
        if any(v == value and type(v) is type(value) for v in good):
            continue
        doc = {"inputs": [0.5] * 10, field: value}
        raw = json.dumps(doc).encode() if media.endswith("json") else msgpack.packb(doc)
        for batch in (False, True):
            body = decode_body(raw, media)
            if batch:
                body["inputs"] = [body["inputs"]]
            with pytest.raises(ValidationError, match=message):
                parse_submission(body, batch=batch, max_items=4)


@pytest.mark.parametrize("digits", [309, 400, 4000])
def test_a_deadline_too_large_for_a_float_is_refused_without_echoing_it(digits: int) -> None:
    body = decode_body(b'{"inputs": [1.0], "deadline_s": 1' + b"0" * digits + b"}",
                       "application/json")
    with pytest.raises(ValidationError, match="an integer of") as refused:
        parse_submission(body, batch=False, max_items=1)
    assert len(str(refused.value)) < 200


def test_cache_false_reaches_the_submission() -> None:
    assert parse_submission({"inputs": [1.0], "cache": False}, batch=False,
                            max_items=1).cache is False
    assert parse_submission({"inputs": [1.0]}, batch=False, max_items=1).cache is True


def test_a_msgpack_value_json_cannot_show_is_refused_all_the_same() -> None:
    """Bytes keys and values (msgpack only) are echoed with ``repr``, never ``json.dumps``."""
    for value in [{b"a": 1}, [b"\xff"], b"float32", list(range(1000))]:
        raw = msgpack.packb({"inputs": [1.0], "dtype": value, "priority": value})
        with pytest.raises(ValidationError, match="dtype must be one of"):
            parse_submission(decode_body(raw, "application/msgpack"), batch=False,
                             max_items=1)
