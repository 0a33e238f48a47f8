from __future__ import annotations

import msgpack
import numpy as np
import pytest

from connectors.broker import Delivery
from schemas import Request, encode_request
from workers.intake import decode_deliveries
from workers.models import load_model

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
