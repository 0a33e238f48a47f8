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

import hmac
import time
from collections.abc import Iterable

from connectors.webhook_jobs import (
    DELIVERY_HEADER,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    signature_header,
)

DEFAULT_TOLERANCE_S = 300


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The ``Batchfleet-Signature`` header value for ``body`` (now, unless ``timestamp``)."""
    return signature_header(secret, body, int(time.time()) if timestamp is None else timestamp)


def verify_signature(
    secret: str | bytes | Iterable[str | bytes], body: bytes, header: str | None, *,
    tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None,
) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` (or one of several) within
    ``tolerance_s`` seconds of ``now``; False for anything else, malformed headers included.
    """
    if not header:
        return False
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1" and value:
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    secrets = [secret] if isinstance(secret, str | bytes) else list(secret)
    expected = [signature_header(s, body, timestamp).rpartition("v1=")[2] for s in secrets]
    # Check every pair, so the time taken does not say which one matched.
    matched = False
    for want in expected:
        for got in candidates:
            matched |= hmac.compare_digest(want, got)
    return matched


__all__ = ["DELIVERY_HEADER", "REQUEST_ID_HEADER", "SIGNATURE_HEADER", "sign",
           "verify_signature"]
