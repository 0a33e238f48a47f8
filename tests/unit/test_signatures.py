"""The webhook signature scheme: what a receiver's verify_signature accepts and refuses."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from producers.signatures import sign, verify_signature

pytestmark = pytest.mark.unit

BODY = b'{"request_id":"r1","status":"succeeded"}'


def test_the_header_is_hmac_sha256_over_timestamp_dot_body() -> None:
    header = sign("s3cret", BODY, timestamp=1_700_000_000)
    want = hmac.new(b"s3cret", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={want}"
    assert verify_signature("s3cret", BODY, header, now=1_700_000_100)


@pytest.mark.parametrize("header", [
    None, "", "garbage", "t=1700000000", "v1=abc", "t=notanumber,v1=abc",
    "t=1700000000,v1=" + "0" * 64,
])
def test_malformed_or_wrong_headers_are_refused(header: str | None) -> None:
    assert not verify_signature("s3cret", BODY, header, now=1_700_000_000)


def test_tampered_body_other_secret_and_stale_timestamp_are_refused() -> None:
    header = sign("s3cret", BODY, timestamp=1_700_000_000)
    assert not verify_signature("s3cret", BODY.replace(b"succeeded", b"failed"), header,
                                now=1_700_000_000)
    assert not verify_signature("other", BODY, header, now=1_700_000_000)
    assert not verify_signature("s3cret", BODY, header, now=1_700_000_000 + 301)
    # The timestamp is signed: moving it forward breaks the signature.
    moved = header.replace("t=1700000000", "t=1700000500")
    assert not verify_signature("s3cret", BODY, moved, now=1_700_000_500)


def test_rotation_several_secrets_and_several_v1_entries() -> None:
    old = sign("old", BODY, timestamp=1_700_000_000)
    new = sign("new", BODY, timestamp=1_700_000_000).split(",")[1]
    assert verify_signature(["new", "old"], BODY, old, now=1_700_000_000)
    assert verify_signature(b"new", BODY, f"{old},{new}", now=1_700_000_000)
