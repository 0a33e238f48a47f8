"""Who may see and spend what: request ownership, derived IDs, idempotency fingerprints
and quota verdicts, as small functions the routes call (see docs/http-api.md).

Key IDs are not secret, so a request ID derived from one must also need a server
secret (HMAC), or any key could compute another's IDs. And "not yours" must read
exactly like "does not exist", so IDs reveal nothing across keys.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from batchfleet.connectors.quotas import OVER_RATE, TOO_BIG, Admission
from batchfleet.connectors.values import StoredRecord
from batchfleet.producers.gateway.auth import ApiKey
from batchfleet.schemas.errors import (
    IdempotencyConflictError,
    LimitExceededError,
    QuotaExceededError,
    RequestNotFoundError,
)


def derive_request_id(secret: bytes, key: ApiKey, idempotency_key: str,
                      index: int | None = None) -> str:
    """Same (key, idempotency key) -> same request ID; without ``secret`` nobody can compute
    it, so another key cannot even guess it, and no other key can collide with it."""
    seed = f"{key.key_id}\0{idempotency_key}" + ("" if index is None else f"\0{index}")
    return "gw-" + hmac.new(secret, seed.encode(), hashlib.sha256).hexdigest()[:40]


def fingerprint(model: str, content_type: str | None, raw: bytes) -> str:
    """What an idempotent submit asked for: the same key with another one is a 409."""
    digest = hashlib.sha256(f"{model}\0{content_type or ''}\0".encode())
    digest.update(raw)
    return digest.hexdigest()[:32]


def not_found(request_id: str) -> RequestNotFoundError:
    """One answer for unknown, expired and another key's requests."""
    return RequestNotFoundError(f"no request {request_id!r} (unknown or expired)")


def readable_body(key: ApiKey, request_id: str, record: StoredRecord | None) -> bytes:
    """The record's body if ``key`` may read it; otherwise exactly "not found"."""
    if record is None or record.body is None or not key.may_read(record.owner):
        raise not_found(request_id)
    return record.body


def replays(key: ApiKey, records: Sequence[StoredRecord | None], fp: str) -> list[bool]:
    """Which derived IDs already have a record (answered, never submitted again); 409 if
    one was made from another model or body."""
    for record in records:
        if record is not None and record.fingerprint != fp:
            raise IdempotencyConflictError(
                f"Idempotency-Key was already used by API key {key.key_id!r} with another "
                "model or another body; use a new key for a new request")
    return [record is not None for record in records]


def refusal(key: ApiKey, verdict: Admission, count: int) -> LimitExceededError | QuotaExceededError:
    """The error for a refused admission: 413 if it can never fit, else 429."""
    quota = key.quota
    if verdict.code == TOO_BIG:
        return LimitExceededError(
            f"{count} requests at once is over API key {key.key_id!r}'s burst "
            f"({quota.bucket}) or in-flight limit ({quota.max_in_flight or 'none'}); "
            "send smaller batches")
    what = (f"{quota.rate_per_s:g} requests/s (burst {quota.bucket})"
            if verdict.code == OVER_RATE else f"{quota.max_in_flight} requests in flight")
    return QuotaExceededError(f"API key {key.key_id!r} is over its quota of {what}",
                              retry_after_s=verdict.retry_after_s,
                              headers=verdict.headers(quota))
