"""``notify_format`` (docs/wire-format.md §3, §8): both decoders read it alike, an unknown
value gets the IDs format, a non-string is a validation error, and the SDK's template
writes exactly what ``encode_request`` writes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from batchfleet.schemas.batch_decode import decode_batch
from batchfleet.schemas.envelopes import NOTIFY_RESULTS, Request, decode_request, encode_request
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.request_template import RequestTemplate

pytestmark = pytest.mark.unit
X = np.arange(10, dtype=np.float32)


def _raw(fmt: object) -> bytes:
    body = {"v": 1, "id": "r1", "model": "demo-mlp", "notify": "c1", "notify_format": fmt,
            "inputs": {"dtype": "float32", "shape": [10], "data": X.tobytes()}}
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("fmt", "read"), [("results", NOTIFY_RESULTS), ("ids", None),
                                           ("later-format", None), (None, None)])
def test_both_decoders_read_the_format_alike(fmt: object, read: str | None) -> None:
    [fast] = decode_batch([_raw(fmt)])
    assert isinstance(fast, Request) and fast.notify_format == read
    assert decode_request(_raw(fmt)).notify_format == read


def test_a_non_string_format_is_a_validation_error() -> None:
    [fast] = decode_batch([_raw(1)])
    assert isinstance(fast, ValidationError) and "notify_format" in str(fast)
    with pytest.raises(ValidationError, match="notify_format"):
        decode_request(_raw(1))


def test_the_sdk_template_writes_what_encode_request_writes() -> None:
    template = RequestTemplate("demo-mlp", "interactive", notify="c1",
                               notify_format=NOTIFY_RESULTS)
    assert not template._reference  # the fast path, checked against the encoder
    raw = template.encode("r1", 1.5, X)
    assert raw == encode_request(Request("r1", "demo-mlp", X, enqueued_at=1.5, notify="c1",
                                         notify_format=NOTIFY_RESULTS))
    assert decode_request(raw).notify_format == NOTIFY_RESULTS
