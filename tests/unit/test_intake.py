from __future__ import annotations

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas import Request, encode_request
from batchfleet.workers.intake import decode_deliveries
from batchfleet.workers.models import load_model

pytestmark = pytest.mark.unit
HANDLERS = {"demo-mlp": load_model("demo-mlp")}


def _delivery(payload: bytes, model: str = "demo-mlp") -> Delivery:
    return Delivery(model, "interactive", payload, token=None)


def test_a_bad_replayed_request_is_answered_under_its_own_generation() -> None:
    raw = msgpack.packb({"v": 1, "id": "r", "model": "demo-mlp", "generation": 2,
                         "notify": "c1", "inputs": "oops"})
    [answer] = decode_deliveries([_delivery(raw)], HANDLERS).answers
    assert answer.generation == 2 and answer.result.generation == 2
    assert answer.notify == "c1" and answer.result.status == "failed"


def test_a_request_on_another_models_lane_is_refused() -> None:
    raw = encode_request(Request("r", "demo-mlp", np.zeros(10, np.float32)))
    [answer] = decode_deliveries([_delivery(raw, "demo-encoder")], HANDLERS).answers
    assert answer.result.error is not None
    assert "published to the 'demo-encoder' lane" in answer.result.error.message


def test_notify_must_be_a_safe_channel_suffix() -> None:
    raw = msgpack.packb({"v": 1, "id": "r", "model": "demo-mlp", "notify": "a b*",
                         "inputs": {"dtype": "float32", "shape": [10], "data": b"\0" * 40}})
    [answer] = decode_deliveries([_delivery(raw)], HANDLERS).answers
    assert answer.result.error is not None and "notify" in answer.result.error.message


def test_expired_on_arrival_is_never_a_job() -> None:
    raw = encode_request(Request("r", "demo-mlp", np.zeros(10, np.float32), deadline_at=1.0))
    intake = decode_deliveries([_delivery(raw)], HANDLERS, now=2.0)
    assert intake.jobs == [] and intake.answers[0].result.status == "expired"


def test_out_of_vocabulary_tokens_are_refused_at_intake_and_never_retried() -> None:
    from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN, ENCODER_VOCAB

    handlers = {"demo-encoder": load_model("demo-encoder")}
    good = np.arange(ENCODER_SEQ_LEN, dtype=np.int64)
    bad = good.copy()
    bad[3] = ENCODER_VOCAB
    negative = good.copy()
    negative[0] = -1
    raws = [encode_request(Request(rid, "demo-encoder", x))
            for rid, x in (("ok", good), ("big", bad), ("neg", negative))]
    intake = decode_deliveries([_delivery(r, "demo-encoder") for r in raws], handlers)
    assert [j.request.request_id for j in intake.jobs] == ["ok"]
    assert [a.result.request_id for a in intake.answers] == ["big", "neg"]
    for answer in intake.answers:
        error = answer.result.error
        assert answer.result.status == "failed" and answer.result.attempts == 1
        assert error is not None and error.type == "validation_error"
        assert error.retryable is False and "[0, 1024)" in error.message


def test_a_validate_hook_that_raises_anything_refuses_only_its_request() -> None:
    def no_negatives(x: object) -> None:
        if float(np.asarray(x).min()) < 0:
            raise ValueError("negative feature")

    handler = load_model("demo-mlp")
    handler.validator = no_negatives  # type: ignore[attr-defined]
    raws = [encode_request(Request(rid, "demo-mlp", np.full(10, v, np.float32)))
            for rid, v in (("a", 1.0), ("b", -1.0))]
    intake = decode_deliveries([_delivery(r) for r in raws], {"demo-mlp": handler})
    assert [j.request.request_id for j in intake.jobs] == ["a"]
    [answer] = intake.answers
    assert answer.result.error is not None
    assert answer.result.error.type == "validation_error"
    assert answer.result.error.message == "ValueError: negative feature"
