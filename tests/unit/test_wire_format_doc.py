"""docs/wire-format.md, read as a raw client reads it, agrees with the code.

The worked example's bytes are the encoder's bytes; every ``error.type`` the doc lists
is one the code can produce, and the lane rule it states is what the worker answers.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas import errors
from batchfleet.schemas.envelopes import (
    Request,
    Result,
    decode_result,
    encode_request,
    encode_result,
)

pytestmark = pytest.mark.unit
DOC = (Path(__file__).resolve().parents[2] / "docs" / "wire-format.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(title)
    return DOC[start:DOC.index("\n### ", start + 1)]


def _xxd_bytes(block: str) -> bytes:
    """The bytes of an ``xxd`` dump: the hex groups between the offset and the text."""
    out = bytearray()
    for line in block.strip().splitlines():
        groups = line.split(":", 1)[1][:41].split()
        out += bytes.fromhex("".join(groups))
    return bytes(out)


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL)


def test_the_worked_request_is_the_encoders_bytes() -> None:
    section = _section("### 9.1 The request")
    python, dump = _code_blocks(section)[:2]
    scope: dict[str, object] = {}
    exec(python, scope)  # the doc's own snippet, asserts included
    assert _xxd_bytes(dump) == scope["raw"]


def test_the_worked_results_decode_as_described() -> None:
    pending = encode_result(Result("req-0001", "pending", model="demo-mlp",
                                   enqueued_at=1700000000.0))
    assert len(pending) == int(re.search(r"is (\d+) bytes", _section("### 9.2")).group(1))
    section = _section("### 9.3 The succeeded result")
    body = _xxd_bytes(next(b for b in _code_blocks(section) if b.startswith("00000000")))
    result = decode_result(body)
    assert result.status == "succeeded" and result.request_id == "req-0001"
    assert len(body) == int(re.search(r"The body is (\d+) bytes", section).group(1))
    # the bytes are the encoder's, model_version included (label/hash, as §6.1 says)
    assert result.model_version.startswith("default/sha256:")
    assert body == encode_result(Result(
        "req-0001", "succeeded", outputs=np.array([0.4730762], np.float32), model="demo-mlp",
        model_version=result.model_version, attempts=1, enqueued_at=1700000000.0,
        started_at=1700000000.004, finished_at=1700000000.0045, queue_ms=4.0,
        compute_ms=0.5, batch_size=8))
    assert f'fixstr({len(result.model_version)}) `"{result.model_version}"`' in section


def test_every_listed_error_type_is_one_the_code_has() -> None:
    table = DOC[DOC.index("| `error.type` | `retryable` |"):]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", table.split("\n\n")[0], flags=re.M))
    known = {cls.wire_type for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.BatchfleetError)}
    assert listed and listed <= known | {"deadline_exceeded", "crash_loop", "cancelled"}, (
        listed - known)


def test_a_request_on_another_models_lane_is_answered_as_the_doc_says() -> None:
    """The doc: the worker never re-routes; the answer is validation_error naming both."""
    from batchfleet.workers.intake import decode_deliveries
    from batchfleet.workers.models import load_model

    assert "never re-routes" in DOC and "unknown_model` | false | — | Never a stored" in DOC
    raw = encode_request(Request("r", "ghost", np.zeros(10, np.float32)))
    [answer] = decode_deliveries([Delivery("demo-mlp", "interactive", raw, token=None)],
                                 {"demo-mlp": load_model("demo-mlp")}).answers
    assert answer.result.error is not None
    assert answer.result.error.type == "validation_error"
    assert ("request names model 'ghost' but was published to the 'demo-mlp' lane"
            in answer.result.error.message)
    assert "request names model 'x' but was published to the 'demo-mlp' lane" in DOC
