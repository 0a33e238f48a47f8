"""Tenancy's pure parts: keys-file options, RateLimit headers, derived IDs, fingerprints and
the ``owner`` envelope field. The Lua side is proven in tests/e2e/test_gateway_tenancy.py."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.connectors.quotas import ADMITTED, OVER_IN_FLIGHT, OVER_RATE, Admission, Quota
from batchfleet.producers.gateway import ApiKey, KeyRing, derive_request_id, fingerprint
from batchfleet.schemas import (
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import ConfigError, ValidationError

pytestmark = pytest.mark.unit

HASH = "0" * 64


def test_keys_file_options_are_optional_and_round_trip() -> None:
    ring = KeyRing.parse(f"old:{HASH}:demo-mlp\n"
                         f"ops:{HASH}:*:scopes=admin\n"
                         f"t:{HASH}:demo-mlp:rate=50 burst=100 in_flight=7  # tenant")
    old, ops, tenant = ring.keys
    assert old.scopes == frozenset() and not old.quota.limited and not old.admin
    assert ops.admin and not ops.quota.limited
    assert tenant.quota == Quota(50.0, 100, 7) and tenant.quota.limited
    assert KeyRing.parse("\n".join(k.line() for k in ring.keys)) == ring
    assert Quota(12.5).bucket == 13  # burst defaults to one second's worth


@pytest.mark.parametrize("options", [
    "scopes=root", "rate=-1", "rate=nan", "burst=5", "in_flight=x", "rate", "speed=3",
    "rate=1 rate=2",
])
def test_bad_key_options_are_config_errors(options: str) -> None:
    with pytest.raises(ConfigError, match="entry 1"):
        KeyRing.parse(f"k:{HASH}:*:{options}")


def test_only_the_owner_or_an_admin_may_read() -> None:
    bill = ApiKey("bill", HASH, frozenset({"*"}))
    admin = ApiKey("root", HASH, frozenset({"*"}), frozenset({"admin"}))
    assert bill.may_read("bill") and not bill.may_read("billing") and not bill.may_read(None)
    assert admin.may_read("bill") and admin.may_read(None)


def test_ratelimit_headers() -> None:
    rate = Quota(50, 100)
    assert Admission(ADMITTED, 99.4, 0, 0).headers(rate) == {
        "RateLimit-Limit": "100", "RateLimit-Remaining": "99", "RateLimit-Reset": "1"}
    assert Admission(OVER_RATE, 0.5, 0, 0.01).headers(rate)["RateLimit-Reset"] == "2"
    slots = Quota(max_in_flight=3)
    assert Admission(OVER_IN_FLIGHT, 0, 3, 1).headers(slots) == {
        "RateLimit-Limit": "3", "RateLimit-Remaining": "0", "RateLimit-Reset": "1"}


def test_derived_ids_need_the_secret_and_are_per_key() -> None:
    bill, billing = (ApiKey(k, HASH, frozenset({"*"})) for k in ("bill", "billing"))
    rid = derive_request_id(b"s1", bill, "order-1")
    assert rid == derive_request_id(b"s1", bill, "order-1") and rid.startswith("gw-")
    assert rid != derive_request_id(b"s2", bill, "order-1")  # rotating the secret
    assert rid != derive_request_id(b"s1", billing, "order-1")
    assert derive_request_id(b"s1", bill, "order-1", 0) != derive_request_id(b"s1", bill,
                                                                             "order-1", 1)


def test_fingerprint_covers_model_content_type_and_body() -> None:
    base = fingerprint("demo-mlp", "application/json", b"{}")
    assert base == fingerprint("demo-mlp", "application/json", b"{}")
    assert len({base, fingerprint("demo-encoder", "application/json", b"{}"),
                fingerprint("demo-mlp", "application/msgpack", b"{}"),
                fingerprint("demo-mlp", "application/json", b"{ }")}) == 4


def test_owner_travels_in_both_envelopes_and_is_optional() -> None:
    req = Request("r1", "demo-mlp", np.zeros(3, np.float32), owner="bill")
    assert decode_request(encode_request(req)).owner == "bill"
    assert decode_request(encode_request(Request("r2", "demo-mlp", np.zeros(1)))).owner is None
    assert b"owner" not in encode_result(Result("r3", "pending"))  # unchanged bytes without one
    assert decode_result(encode_result(Result("r4", "pending", owner="bill"))).owner == "bill"
    with pytest.raises(ValidationError, match="owner"):
        decode_request(encode_request(Request("r5", "demo-mlp", np.zeros(1), owner="a,b")))


def test_hash_key_writes_scopes_and_limits_into_the_line() -> None:
    from typer.testing import CliRunner

    from batchfleet.cli import app

    out = CliRunner().invoke(app, ["gateway", "hash-key", "--id", "t", "--models", "demo-mlp",
                                   "--rate", "50", "--burst", "100", "--max-in-flight", "7",
                                   "--scopes", "admin"])
    assert out.exit_code == 0, out.output
    line = out.stdout.strip().splitlines()[-1]
    key = KeyRing.parse(line).keys[0]
    assert key.admin and key.quota == Quota(50.0, 100, 7) and line.startswith("t:")
    bad = CliRunner().invoke(app, ["gateway", "hash-key", "--scopes", "root"])
    assert bad.exit_code != 0 and "unknown scope" in bad.output
