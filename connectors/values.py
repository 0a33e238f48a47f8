"""The values the control-plane and broker protocols speak, with no driver behind them.

Every backend (Redis, ``memory://``, a plugin) returns and takes these types, so the
protocols in ``connectors.control_plane`` and ``connectors.broker`` import only this
module, and code above ``connectors/`` never needs a Redis or Kafka module to name them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final, NamedTuple

from batchfleet.schemas.tensors import Tensors

#: How long a result record is kept by default (seconds).
DEFAULT_TTL_S = 24 * 3600

#: How long a call waits for a free pooled connection before it fails (seconds).
DEFAULT_POOL_TIMEOUT_S = 5.0

#: Eviction policies that never evict a key without a TTL: streams and pending records
#: are safe.
SAFE_POLICY_PREFIXES = ("noeviction", "volatile-")


class LogPosition(NamedTuple):
    """Where a delivery sits in an ordered log (a Kafka partition, as its consumer group
    reads it): what lets a transport with no delivery count tell a first delivery apart
    (``workers.log_positions``)."""

    #: The group, topic and partition, as one name: ``{group}/{topic}/{partition}``.
    log: str
    offset: int
    #: The record's timestamp (epoch ms), or -1 where the log gives none.
    timestamp_ms: int


class LogClaim(NamedTuple):
    """What had been handed out of one log before a claim (``claim_positions``)."""

    #: The highest offset any consumer handed out, or -1 where none is on record.
    offset: int
    #: The newest record timestamp among those handed out (epoch ms), or -1.
    timestamp_ms: int


class SubmitState(IntEnum):
    """What ``put_pending`` found for each request ID."""

    NEW = 0
    #: Already submitted and not finished: publishing again is harmless (first result wins).
    PENDING = 1
    #: Already finished: a duplicate submit must not run it again.
    TERMINAL = 2
    #: Taken by a submit with another fingerprint (idempotency key reused): never publish.
    CONFLICT = 3


@dataclass(frozen=True, slots=True)
class Ownership:
    """Who a pending record belongs to, and (idempotent gateway submits) what it asked for."""

    owner: str | None = None
    #: Hash of model and body (or inputs): the same ID with another one is a conflict.
    fingerprint: str | None = None
    #: The submitting client's ID: a cancel announces its ``cancelled`` result there.
    notify: str | None = None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A result record's ownership and state, for access checks before a body is decoded."""

    status: str
    owner: str | None
    fingerprint: str | None
    body: bytes | None = None


class TerminalWrite(NamedTuple):
    """One terminal result ready to be stored (a named tuple: one per request written, and
    a frozen dataclass's ``__init__`` costs three times as much)."""

    request_id: str
    status: str
    body: bytes
    notify_channel: str | None = None
    generation: int = 0
    #: ``NOTIFY_RESULTS``: announce the body with the ID; None: the ID alone (§8).
    notify_format: str | None = None


@dataclass(frozen=True, slots=True)
class CancelView:
    """A record as a cancel sees it: its generation fences the ``cancelled`` write, and
    its client (``notify``) is where that result is announced."""

    status: str
    generation: int
    notify: str | None
    body: bytes | None


class DeliveryCount(NamedTuple):
    """What ``count_deliveries`` found for one request."""

    deliveries: int
    solo: int
    #: Generation of its terminal result, or -1 while it has none: a copy at or below
    #: it is finished (ack it, don't run it).
    done_gen: int
    #: The record's current generation: a copy below it was superseded by a replay.
    gen: int


class Lettered(IntEnum):
    """What ``DeadLetterQueue.add`` did with one letter."""

    #: The record is at a newer generation (replayed): this copy is superseded, drop it.
    STALE = -1
    #: Already dead-lettered at this generation, or already terminal: no second entry.
    KNOWN = 0
    ADDED = 1


@dataclass(frozen=True, slots=True)
class Undecodable:
    raw: bytes
    reason: str
    source: str


@dataclass(slots=True)
class DeadLetter:
    """One dead-lettered request."""

    request_id: str
    model: str
    envelope: bytes
    attempts: int
    errors: list[dict[str, Any]]
    reason: str
    dead_at: float = field(default_factory=time.time)
    entry_id: str = ""
    #: The request's generation: at most one letter per (request ID, generation).
    generation: int = 0

    @property
    def last_error_type(self) -> str:
        return str(self.errors[-1].get("type", "")) if self.errors else ""


class Announced(NamedTuple):
    request_id: str
    #: The result envelope; None when the message carried the ID alone (read it back).
    body: bytes | None


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """What a hit answers with: the outputs and the version that computed them."""

    model_version: str
    outputs: Tensors
    #: Compute seconds per row of the batch that computed it (what a hit saves).
    compute_s: float = 0.0


class Retry(NamedTuple):
    """One retry to schedule: when, the envelope (stamped with its next attempt), and
    the request and generation it belongs to."""

    due: float
    envelope: bytes
    request_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class StorePressure:
    """How full a store (or a broker's server) is: admission and readiness read it."""

    used_memory: int
    #: 0: no limit.
    max_memory: int
    eviction_policy: str
    #: (model, lane) -> entries queued (Redis Streams only).
    depths: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def memory_fraction(self) -> float:
        """``used_memory / maxmemory``; 0 when Redis has no limit."""
        return self.used_memory / self.max_memory if self.max_memory > 0 else 0.0

    @property
    def eviction_safe(self) -> bool:
        """False for ``allkeys-*``: Redis may then evict a stream (the queue itself)."""
        return self.eviction_policy.startswith(SAFE_POLICY_PREFIXES)



#: A degraded success's body starts with this packed pair (``"degraded": true``), right
#: after the map's header: a fallback answered, so DLQ replay may reopen it for a real
#: answer (docs/degradation.md). Only there: outputs may hold these bytes by chance.
DEGRADED_MARK: Final = b"\xa8degraded\xc3"


def degraded_body(body: bytes) -> bool:
    """The map's first key is ``degraded: true``: after a fixmap's one header byte or a
    map16's three (a degraded result has 17 to 21 keys)."""
    return body[1:11] == DEGRADED_MARK or body[3:13] == DEGRADED_MARK


def reopenable(status: object, body: object) -> bool:
    """May DLQ replay reopen a record: failed, pending (an earlier replay stopped before it
    published) or a degraded success. The result store's script applies the same rule."""
    if status in ("failed", "pending"):
        return True
    return status == "succeeded" and isinstance(body, bytes) and degraded_body(body)
