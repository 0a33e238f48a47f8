"""Verifying batchfleet webhooks on the receiving side.

Every delivery carries ``Batchfleet-Signature: t=TIMESTAMP,v1=HEX``, where HEX
is HMAC-SHA256 with the shared secret over ``b"{TIMESTAMP}." + raw_body``.
Verify against the *raw* request bytes (re-serialized JSON will not match),
compare in constant time, and refuse old timestamps so a captured delivery
cannot be replayed. Several ``v1=`` entries may appear (secret rotation); one
match is enough. Deduplicate on ``Batchfleet-Delivery``: deliveries are
at-least-once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterable

from batchfleet.connectors.webhook_jobs import (
    DELIVERY_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    signature_header,
)

DEFAULT_TOLERANCE_S = 300


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The ``Batchfleet-Signature`` header value for ``body`` (now, unless ``timestamp``)."""
    return signature_header(secret, body, int(time.time()) if timestamp is None else timestamp)


#: A Unix timestamp has 10 digits until 2286; more is malformed, and ``int()`` of a few
#: thousand digits would raise.
_MAX_TIMESTAMP_DIGITS = 12
#: Entries looked at per header, so a huge header cannot cost a receiver much.
_MAX_PARTS = 32
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def verify_signature(
    secret: str | bytes | Iterable[str | bytes], body: bytes | str, header: str | bytes | None,
    *, tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None,
) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` (or one of several) within
    ``tolerance_s`` seconds of ``now``; False for anything else, malformed headers included.

    It never raises, whatever the header, body, secrets or numbers: a receiver calls it
    on input an attacker controls, and an exception there is a 500, not a refusal.
    """
    parsed = _parse(header)
    raw, keys = _as_bytes(body), _keys(secret)
    if parsed is None or raw is None or not keys:
        return False
    timestamp, candidates = parsed
    try:
        fresh = abs((time.time() if now is None else now) - timestamp) <= tolerance_s
    except (TypeError, ValueError, OverflowError):
        return False
    if not fresh:  # also False for a NaN ``now`` or tolerance
        return False
    expected = [hmac.new(key, f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
                for key in keys]
    # Check every pair, so the time taken does not say which one matched.
    matched = False
    for want in expected:
        for got in candidates:
            matched |= hmac.compare_digest(want, got)
    return matched


def _parse(header: str | bytes | None) -> tuple[int, list[str]] | None:
    """(timestamp, v1 digests) from ``t=...,v1=...``, or None when malformed."""
    if isinstance(header, bytes | bytearray):
        try:
            header = bytes(header).decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(header, str) or not header:
        return None
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(",", _MAX_PARTS)[:_MAX_PARTS]:
        name, _, value = part.strip().partition("=")
        # isdigit() alone lets "²" through, which int() refuses: ASCII digits only.
        if (name == "t" and value.isascii() and value.isdigit()
                and len(value) <= _MAX_TIMESTAMP_DIGITS):
            timestamp = int(value)
        elif name == "v1" and _HEX_DIGEST.fullmatch(value):
            candidates.append(value)
    if timestamp is None or not candidates:
        return None
    return timestamp, candidates


def _as_bytes(value: object) -> bytes | None:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError:  # lone surrogates
            return None
    return None


def _keys(secret: object) -> list[bytes]:
    """The secrets as bytes; empty (so nothing verifies) when any of them is unusable."""
    items = [secret] if isinstance(secret, str | bytes | bytearray) else secret
    try:
        keys = [_as_bytes(s) for s in items]  # type: ignore[attr-defined]
    except TypeError:
        return []
    return [k for k in keys if k] if all(k is not None for k in keys) else []


__all__ = ["DELIVERY_HEADER", "REQUEST_ID_HEADER", "SIGNATURE_HEADER", "sign",
           "verify_signature"]
