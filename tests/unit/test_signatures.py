"""The webhook signature scheme: what a receiver's verify_signature accepts and refuses."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfleet.producers.signatures import sign, verify_signature

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


@pytest.mark.parametrize("header", [
    "t=\u00b2,v1=00", "t=\u0661\u0662,v1=" + "0" * 64, "t=" + "9" * 5000 + ",v1=" + "0" * 64,
    "t=1700000000,v1=\u00e9" + "0" * 63, "t=1700000000,v1=" + "0" * 6400, "t=-5,v1=00",
    "t=,v1=", "=,=,=", ",", "t=1700000000," * 10_000, b"\xff\xfe", "t=1700000000,v1=\ud800",
])
def test_crafted_headers_are_refused_not_raised(header: str | bytes) -> None:
    assert verify_signature("s3cret", BODY, header, now=1_700_000_000) is False


def test_bodies_and_headers_as_str_or_bytes_and_odd_numbers() -> None:
    header = sign("s3cret", BODY, timestamp=1_700_000_000)
    assert verify_signature("s3cret", BODY.decode(), header.encode(), now=1_700_000_000)
    for now, tolerance in [(float("nan"), 300), (1_700_000_000, float("nan")),
                           (float("inf"), 300), (1e308, 300), (1_700_000_000, -1)]:
        assert not verify_signature("s3cret", BODY, header, now=now, tolerance_s=tolerance)
    assert not verify_signature("", BODY, sign("", BODY, timestamp=1_700_000_000),
                                now=1_700_000_000)  # an empty secret verifies nothing
    assert not verify_signature("\ud800", BODY, header, now=1_700_000_000)
    assert not verify_signature(["s3cret", 5], BODY, header, now=1_700_000_000)  # type: ignore[list-item]
    assert not verify_signature("s3cret", "\ud800", header, now=1_700_000_000)


_SECRETS = st.one_of(st.text(), st.binary(), st.lists(st.one_of(st.text(), st.binary()),
                                                       max_size=3))
_NUMBERS = st.one_of(st.floats(), st.integers(-(10**30), 10**30))
_HEADERS = st.one_of(
    st.none(), st.text(), st.binary(),
    st.builds(lambda t, v, rest: f"t={t},v1={v}{rest}", st.text(max_size=30),
              st.text(max_size=80), st.text(max_size=40)),
    st.builds(lambda t, v: f"t={t},v1={v}", st.integers(-(10**40), 10**40),
              st.from_regex(r"[0-9a-f]{0,70}", fullmatch=True)),
)


@settings(max_examples=500, deadline=None)
@given(_SECRETS, st.one_of(st.binary(), st.text()), _HEADERS, _NUMBERS,
       st.one_of(st.none(), _NUMBERS))
def test_fuzz_verify_signature_never_raises(secret: Any, body: Any, header: Any,
                                            tolerance: Any, now: Any) -> None:
    assert verify_signature(secret, body, header, tolerance_s=tolerance, now=now) in (
        True, False)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1), st.binary(),
       st.integers(0, 10**10))
def test_fuzz_what_sign_signs_verifies(secret: str, body: bytes, timestamp: int) -> None:
    try:
        secret.encode()
    except UnicodeEncodeError:
        return
    header = sign(secret, body, timestamp=timestamp)
    assert verify_signature(secret, body, header, now=timestamp)
    assert not verify_signature(secret, body + b"x", header, now=timestamp)
