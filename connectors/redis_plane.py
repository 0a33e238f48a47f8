"""Redis implements every control-plane seam, over one connection pool."""

from __future__ import annotations

from dataclasses import dataclass

from batchfleet.connectors.announcements import RedisAnnouncements
from batchfleet.connectors.dead_letters import DeadLetterQueue, UndecodableSink
from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.result_cache import RedisResultCache
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.schemas.names import Names


@dataclass(frozen=True, slots=True)
class RedisControlPlane:
    """A ``ControlPlane``: each seam a Redis class, all over the result store's client."""

    results: ResultStore
    announcements: RedisAnnouncements
    dead_letters: DeadLetterQueue
    undecodable: UndecodableSink
    retry_schedule: RetrySchedule
    heartbeats: RedisHeartbeats
    models: RedisModelRegistry
    result_cache: RedisResultCache

    async def close(self) -> None:
        await self.results.close()


def redis_control_plane(store: ResultStore) -> RedisControlPlane:
    """Every seam over the store's own client (one pool, closed with the store)."""
    client, names = store.redis, store.names
    return RedisControlPlane(
        results=store, announcements=RedisAnnouncements(client, names),
        dead_letters=DeadLetterQueue(client, names, store.ttl_s),
        undecodable=UndecodableSink(client, names), retry_schedule=RetrySchedule(client, names),
        heartbeats=RedisHeartbeats(client, names), models=RedisModelRegistry(client, names),
        result_cache=RedisResultCache(client, names))


def open_redis_control_plane(url: str, names: Names, ttl_s: int,
                             max_connections: int | None = None) -> RedisControlPlane:
    from batchfleet.connectors import redis_client

    return redis_control_plane(ResultStore(redis_client(url, max_connections), names, ttl_s))
