"""Redis implements every control-plane seam, over one connection pool."""

from __future__ import annotations

from dataclasses import dataclass

from batchfleet.connectors.announcements import RedisAnnouncements
from batchfleet.connectors.dead_letters import DeadLetterQueue, UndecodableSink
from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.redis_client import is_cluster
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
    letters, retries = DeadLetterQueue, RetrySchedule
    if is_cluster(client):  # a result record and a control-plane key: different slots
        from batchfleet.connectors.cluster_plane import (
            ClusterDeadLetterQueue,
            ClusterRetrySchedule,
        )

        letters, retries = ClusterDeadLetterQueue, ClusterRetrySchedule
    return RedisControlPlane(
        results=store, announcements=RedisAnnouncements(client, names),
        dead_letters=letters(client, names, store.ttl_s),
        undecodable=UndecodableSink(client, names), retry_schedule=retries(client, names),
        heartbeats=RedisHeartbeats(client, names), models=RedisModelRegistry(client, names),
        result_cache=RedisResultCache(client, names))


def open_redis_control_plane(url: str, names: Names, ttl_s: int,
                             max_connections: int | None = None) -> RedisControlPlane:
    from batchfleet.connectors.cluster_store import store_for
    from batchfleet.connectors.redis_client import names_for, redis_client

    return redis_control_plane(
        store_for(redis_client(url, max_connections), names_for(url, names), ttl_s))
