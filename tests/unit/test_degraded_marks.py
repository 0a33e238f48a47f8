"""The degraded marks on the wire (new optional keys, no version bump) and in JSON, and the
``degrade`` request key through every encoder and decoder."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.values import reopenable
from batchfleet.producers.gateway.bodies import parse_submission
from batchfleet.schemas.batch_decode import decode_batch
from batchfleet.schemas.envelopes import (
    ErrorInfo,
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.json_form import result_to_json
from batchfleet.schemas.request_template import RequestTemplate
from batchfleet.schemas.result_template import encode_results

CAUSE = ErrorInfo("model_error", "RuntimeError: down", True)


def _degraded(rid: str = "r1") -> Result:
    return Result(rid, "succeeded", np.array([0.5], np.float32), model="m",
                  degraded=True, degraded_reason="error", fallback="value",
                  degraded_error=CAUSE)


def test_a_degraded_result_round_trips_and_a_plain_one_keeps_its_bytes() -> None:
    body = encode_result(_degraded())
    back = decode_result(body)
    assert back.degraded and back.degraded_reason == "error" and back.fallback == "value"
    assert back.degraded_error == CAUSE and back.error is None and back.model_version == ""
    keys = list(msgpack.unpackb(body))
    assert keys[0] == "degraded" and keys[-3:] == ["degraded_reason", "fallback",
                                                   "degraded_error"]
    plain = Result("r2", "succeeded", np.array([0.5], np.float32))
    assert "degraded" not in msgpack.unpackb(encode_result(plain))
    assert not decode_result(encode_result(plain)).degraded


def test_the_batch_template_leaves_a_degraded_result_to_the_full_encoder() -> None:
    results = [Result("a", "succeeded", np.array([0.1], np.float32)), _degraded("b")]
    assert encode_results(results) == [encode_result(r) for r in results]


def test_json_carries_the_marks_for_http_and_webhooks() -> None:
    body = result_to_json(_degraded())
    assert body["degraded"] is True and body["fallback"] == "value"
    assert body["degraded_error"] == CAUSE.to_wire() and body["error"] is None
    plain = result_to_json(Result("r", "succeeded"))
    assert plain["degraded"] is False and plain["degraded_error"] is None


def test_degrade_never_rides_every_request_encoder_and_anything_else_is_refused() -> None:
    inputs = np.zeros(10, np.float32)
    req = Request("r1", "m", inputs, degrade="never")
    assert decode_request(encode_request(req)).degrade == "never"
    assert "degrade" not in msgpack.unpackb(encode_request(Request("r2", "m", inputs)))
    template = RequestTemplate("m", "interactive", degrade="never")
    raw = template.encode("r3", 1.0, inputs)
    assert raw == encode_request(template.request("r3", 1.0, inputs))
    [decoded] = decode_batch([raw])
    assert decoded.degrade == "never"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="degrade must be"):
        decode_request(msgpack.packb({**msgpack.unpackb(encode_request(req)),
                                      "degrade": "sometimes"}))


def test_the_gateway_takes_degrade_allow_or_never() -> None:
    sub = parse_submission({"inputs": [0.0] * 10, "degrade": "never"}, batch=False,
                           max_items=10)
    assert sub.degrade == "never"
    assert parse_submission({"inputs": [0.0]}, batch=False, max_items=1).degrade == "allow"
    with pytest.raises(ValidationError, match="degrade"):
        parse_submission({"inputs": [0.0], "degrade": "maybe"}, batch=False, max_items=1)


def test_replay_reopens_failed_pending_and_degraded_records_only() -> None:
    assert reopenable("failed", None) and reopenable("pending", b"")
    assert reopenable("succeeded", encode_result(_degraded()))
    assert not reopenable("succeeded", encode_result(Result("r", "succeeded")))
    # a model's own answer whose output bytes happen to hold the mark is not reopened
    lookalike = np.frombuffer(b"\xa8degraded\xc3" * 3, np.uint8)
    assert not reopenable("succeeded", encode_result(Result("r", "succeeded", lookalike)))
    many = Result("r", "succeeded", lookalike, owner="o", cached=False, degraded=True,
                  degraded_reason="error", fallback="value")  # map16: 3 header bytes
    assert reopenable("succeeded", encode_result(many))
    assert not reopenable("expired", None)
