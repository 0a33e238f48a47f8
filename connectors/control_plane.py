"""The control plane as small protocols, and the one factory that opens them.

Workers, producers and the CLI talk to these seams, never to a driver: each
protocol is one job, and :class:`ControlPlane` holds one implementation of each.
Redis implements them all today (``connectors.redis_plane``); another store is
one module with an ``open_*`` function plus one line in :data:`FACTORIES`.

* :class:`Results` — pending records and first-terminal-wins writes, reads, replay.
* :class:`Announcements` — subscribe to the IDs finished for one client (the
  publish happens inside the winning terminal write, so a lost write is silent).
* :class:`DeliveryLedger` — durable delivery counts, solo runs (crash loops) and
  compute stalls (hangs).
* :class:`LaneLosses` — lanes recreated after the broker lost their entries.
* :class:`DeadLetters` / :class:`UndecodableLetters` — exhausted and unreadable messages.
* :class:`RetrySchedule` — retries waiting for their backoff to pass.
* :class:`Heartbeats` — live workers, found without scanning the keyspace.
* :class:`Pressure` — store memory and eviction policy, for admission and readiness.
* :class:`ResultCache` — computed outputs by content key, with a TTL (``connectors.result_cache``).

* :class:`ModelRegistry` — one record per model: versions, declared, served, policy
  (its own module, ``connectors.model_registry``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from batchfleet.connectors.announcements import Announced
from batchfleet.connectors.dead_letters import DeadLetter, Lettered, Undecodable
from batchfleet.connectors.model_registry import ModelRegistry
from batchfleet.connectors.redis_pressure import RedisPressure
from batchfleet.connectors.result_cache import CacheEntry
from batchfleet.connectors.result_store import (
    DeliveryCount,
    Ownership,
    StoredRecord,
    SubmitState,
    TerminalWrite,
)
from batchfleet.connectors.retry_schedule import Retry
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.heartbeat import HeartbeatRecord
from batchfleet.schemas.names import Names


class Results(Protocol):
    ttl_s: int

    async def put_pending(self, records: Sequence[tuple[str, bytes]],
                          owners: Sequence[Ownership] | None = None) -> list[SubmitState]: ...
    async def write_terminal(self, writes: Sequence[TerminalWrite]) -> list[bool]: ...
    async def get_bodies(self, request_ids: Sequence[str], terminal_only: bool = False
                         ) -> list[bytes | None]: ...
    async def get_records(self, request_ids: Sequence[str], with_body: bool = False
                          ) -> list[StoredRecord | None]: ...
    async def missing(self, request_ids: Sequence[str]) -> list[str]: ...
    async def reopen_for_replay(self, records: Sequence[tuple[str, bytes]]) -> list[int]: ...
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


class Subscription(Protocol):
    async def next(self, timeout_s: float) -> list[Announced]: ...
    async def close(self) -> None: ...


class Announcements(Protocol):
    async def subscribe(self, client_id: str) -> Subscription: ...


class DeliveryLedger(Protocol):
    async def count_deliveries(self, counted: Sequence[tuple[str, int]]
                               ) -> list[DeliveryCount]: ...
    async def mark_solo(self, request_id: str, started: bool, attempt: int = 1) -> None: ...
    async def note_stalls(self, request_ids: Sequence[str]) -> list[int]: ...


class LaneLosses(Protocol):
    async def mark_lane_losses(self, losses: Mapping[str, int]) -> None: ...
    async def lane_losses(self) -> dict[str, int]: ...


class Pressure(Protocol):
    async def pressure(self) -> RedisPressure: ...


class DeadLetters(Protocol):
    async def add(self, letters: Sequence[DeadLetter]) -> list[Lettered]: ...
    async def models(self) -> list[str]: ...
    def pages(self, model: str, page: int = ..., after: str = ...
              ) -> AsyncIterator[list[DeadLetter]]: ...
    async def list(self, model: str) -> list[DeadLetter]: ...
    async def size(self, model: str) -> int: ...
    async def sizes(self, models: Sequence[str]) -> dict[str, int]: ...
    async def remove(self, letters: Sequence[DeadLetter]) -> int: ...
    async def purge(self, model: str) -> int: ...


class UndecodableLetters(Protocol):
    async def add(self, items: Sequence[Undecodable]) -> None: ...
    async def size(self) -> int: ...


class RetrySchedule(Protocol):
    async def add(self, items: Sequence[tuple[float, bytes]]) -> None: ...
    async def add_live(self, retries: Sequence[Retry]) -> list[bool]: ...
    async def claim_due(self, now: float, limit: int = 500, lease_s: float = 30.0
                        ) -> list[bytes]: ...
    async def done(self, envelopes: Sequence[bytes]) -> None: ...
    async def next_due(self) -> float | None: ...
    async def size(self) -> int: ...


class Heartbeats(Protocol):
    async def write(self, worker_id: str, info: Mapping[str, Any], ttl_s: int) -> bool: ...
    async def read_all(self, ttl_s: int = 10) -> list[HeartbeatRecord]: ...
    async def forget(self, worker_id: str) -> None: ...


class ResultCache(Protocol):
    """Computed outputs keyed by ``result_cache.cache_key`` digests: one round trip per
    batch each way; a failure raises ``ResultStoreError`` (callers treat it as a miss)."""

    async def get_many(self, digests: Sequence[str]) -> list[CacheEntry | None]: ...
    async def put_many(self, entries: Sequence[tuple[str, CacheEntry]], ttl_s: int) -> None: ...


class StoreResults(Results, DeliveryLedger, LaneLosses, Pressure, Protocol):
    """What one result record holds: the Redis store keeps the ledger and lane losses
    beside the results, so one implementation answers all four."""


class ControlPlane(Protocol):
    """One implementation of each seam. A store module provides a frozen dataclass with
    these fields (``redis_plane.RedisControlPlane``); callers see only the protocols."""

    @property
    def results(self) -> StoreResults: ...
    @property
    def announcements(self) -> Announcements: ...
    @property
    def dead_letters(self) -> DeadLetters: ...
    @property
    def undecodable(self) -> UndecodableLetters: ...
    @property
    def retry_schedule(self) -> RetrySchedule: ...
    @property
    def heartbeats(self) -> Heartbeats: ...
    @property
    def models(self) -> ModelRegistry: ...
    @property
    def result_cache(self) -> ResultCache: ...

    async def close(self) -> None:
        """Close the connections the seams share (once, whatever number of seams)."""


#: Opens a control plane: (url, names, ttl_s, max_connections) -> ControlPlane.
PlaneFactory = Callable[[str, Names, int, "int | None"], ControlPlane]


def _redis(url: str, names: Names, ttl_s: int, max_connections: int | None) -> ControlPlane:
    from batchfleet.connectors.redis_plane import open_redis_control_plane

    return open_redis_control_plane(url, names, ttl_s, max_connections)


def _memory(url: str, names: Names, ttl_s: int) -> ControlPlane:
    from batchfleet.connectors.memory_plane import open_memory_control_plane

    return open_memory_control_plane(url, names, ttl_s)


#: URL scheme -> factory. A new result store is one module plus one line here.
FACTORIES: dict[str, PlaneFactory] = {
    "redis": _redis, "rediss": _redis, "unix": _redis, "redis+cluster": _redis,
    "memory": lambda url, names, ttl_s, _: _memory(url, names, ttl_s)}


def open_control_plane(url: str, names: Names, ttl_s: int = 24 * 3600,
                       max_connections: int | None = None) -> ControlPlane:
    """The control plane behind ``url``, chosen by its scheme."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    factory = FACTORIES.get(scheme)
    if factory is None:
        raise ConfigError(f"no result store for {url!r}: schemes are {sorted(FACTORIES)}")
    return factory(url, names, ttl_s, max_connections)


class BulkJobStore(Protocol):
    """Bulk job records (``connectors.bulk_jobs``): fields, a lease, an index for listing.
    Outside the :class:`ControlPlane` because only ``bulk`` runs and the CLI open it."""

    async def take_lease(self, job_id: str, token: str, ttl_s: int) -> str | None: ...
    async def steal_lease(self, job_id: str, holder: str, token: str, ttl_s: int
                          ) -> bool: ...
    async def release_lease(self, job_id: str, token: str) -> None: ...
    async def fields(self, job_id: str) -> dict[str, str]: ...
    async def read(self, job_id: str) -> tuple[dict[str, str], str | None]: ...
    async def create(self, job_id: str, fields: Mapping[str, Any], created_at: float
                     ) -> None: ...
    async def fenced_write(self, job_id: str, token: str, fields: Mapping[str, Any],
                           lease_ttl_s: int, job_ttl_s: int) -> int: ...
    async def write(self, job_id: str, fields: Mapping[str, Any]) -> None: ...
    async def recent(self, limit: int) -> list[str]: ...
    async def index_shard(self, job_id: str, record_id: str, started_at: float,
                          ttl_s: int) -> None: ...
    async def shards_of(self, job_id: str) -> list[str]: ...
    async def unindex(self, job_ids: Sequence[str]) -> None: ...
    async def close(self) -> None: ...
