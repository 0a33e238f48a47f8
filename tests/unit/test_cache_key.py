"""The result cache's key (docs/cache.md): equal for equal inputs on one exact version, and
different whenever anything that determines the output differs; plus the entry codec and
the envelope fields the cache adds (``cache`` on a request, ``cached`` on a result)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.result_cache import cache_key, decode_entry, encode_entry
from batchfleet.connectors.values import CacheEntry
from batchfleet.schemas.envelopes import (
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import ConfigError, ValidationError

pytestmark = pytest.mark.unit

V1 = "default/sha256:a5402bab5d41"
X = np.arange(10, dtype=np.float32) / 7


def test_equal_inputs_share_a_key_however_they_are_laid_out() -> None:
    key = cache_key("m", V1, X)
    assert key == cache_key("m", V1, X.copy()) and len(key) == 32
    strided = np.stack([X, X], axis=1)[:, 0]  # not contiguous, the same values
    assert not strided.flags.c_contiguous and cache_key("m", V1, strided) == key
    named = {"a": X, "b": X[:3]}
    assert cache_key("m", V1, named) == cache_key("m", V1, {"b": X[:3].copy(), "a": X})


@pytest.mark.parametrize("model, version, inputs", [
    ("other", V1, X),                                              # model
    ("m", "default/sha256:ffffffffffff", X),                       # weights
    ("m", V1 + "/onnx-int8", X),                                   # runtime and precision
    ("m", "v2/sha256:a5402bab5d41", X),                            # label
    ("m", V1, X.astype(np.float64)),                               # dtype, same values
    ("m", V1, X.view(np.int32)),                                   # dtype, same bytes
    ("m", V1, X.reshape(2, 5)),                                    # shape, same bytes
    ("m", V1, X.astype(">f4")),                                    # byte order
    ("m", V1, np.where(np.arange(10) == 3, np.nextafter(X, np.float32(2)), X)),  # one ulp
    ("m", V1, {"x": X}),                                           # named, not bare
    ("m", V1, X[:9]),                                              # a row shorter
])
def test_anything_that_changes_the_output_changes_the_key(model: str, version: str,
                                                          inputs: object) -> None:
    assert cache_key(model, version, inputs) != cache_key("m", V1, X)  # type: ignore[arg-type]


def test_fields_cannot_run_into_each_other() -> None:
    assert cache_key("ab", "c", X) != cache_key("a", "bc", X)
    assert cache_key("m", V1, {"ab": X[:1], "c": X[1:]}) != \
        cache_key("m", V1, {"a": X[:1], "bc": X[1:]})
    assert cache_key("m", V1, {"a": X[:2], "b": X[2:]}) != \
        cache_key("m", V1, {"a": X[:3], "b": X[3:]})


def test_an_entry_round_trips_and_garbage_reads_as_a_miss() -> None:
    entry = CacheEntry(V1, {"p": X[:1], "q": X[:2]}, 0.0125)
    back = decode_entry(encode_entry(entry))
    assert back is not None and back.model_version == V1 and back.compute_s == 0.0125
    assert isinstance(back.outputs, dict)
    np.testing.assert_array_equal(back.outputs["q"], X[:2])
    assert decode_entry(b"\xc1 not msgpack") is None
    assert decode_entry(msgpack.packb({"v": 99, "model_version": V1})) is None
    assert decode_entry(msgpack.packb({"v": 1, "model_version": V1, "outputs": 3})) is None


def test_the_request_flag_and_the_result_flag_on_the_wire() -> None:
    req = Request("r-1", "demo-mlp", X)
    plain = encode_request(req)
    assert b"cache" not in plain  # old envelopes and default requests are unchanged
    assert decode_request(plain).cache is True
    req.cache = False
    assert decode_request(encode_request(req)).cache is False
    body = msgpack.unpackb(plain)
    for bad in ("no", 0, 1):
        with pytest.raises(ValidationError, match="cache"):
            decode_request(msgpack.packb({**body, "cache": bad}))
    assert decode_request(msgpack.packb({**body, "cache": None})).cache is True

    res = Result("r-1", "succeeded", outputs=X[:1], model_version=V1)
    assert b"cached" not in encode_result(res) and decode_result(encode_result(res)).cached is False
    res.cached = True
    assert decode_result(encode_result(res)).cached is True


def test_the_owner_scope_keys_each_owner_apart_and_shared_keys_everyone_alike() -> None:
    """``--cache-scope owner`` (the default): another owner's key never matches, ownerless
    requests share one; ``shared``: one key whoever asks, never equal to an owned one."""
    alice, bob = (cache_key("m", V1, X, owner=o) for o in ("alice", "bob"))
    nobody = cache_key("m", V1, X)
    assert len({alice, bob, nobody}) == 3
    assert cache_key("m", V1, X, owner="alice") == alice and cache_key("m", V1, X) == nobody
    shared = {cache_key("m", V1, X, owner=o, scope="shared") for o in ("alice", "bob", None)}
    assert len(shared) == 1 and shared.isdisjoint({alice, bob, nobody})
    # the owner field cannot run into the tensor that follows it
    assert cache_key("m", V1, {"a": X}, owner="x") != cache_key("m", V1, {"xa": X}, owner="")
    with pytest.raises(ConfigError):
        cache_key("m", V1, X, scope="everyone")
