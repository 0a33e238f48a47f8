"""Redis implements every control-plane seam, over one connection pool; registered under
``redis``, ``rediss``, ``unix`` and ``redis+cluster`` (``batchfleet.control_planes``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchfleet.connectors.announcements import RedisAnnouncements
from batchfleet.connectors.broker import Broker
from batchfleet.connectors.bulk_jobs import RedisBulkJobs
from batchfleet.connectors.dead_letters import DeadLetterQueue, UndecodableSink
from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.output_stats import RedisOutputStats
from batchfleet.connectors.pipelines import RedisPipelineRegistry
from batchfleet.connectors.quotas import QuotaGate
from batchfleet.connectors.redis_client import is_cluster
from batchfleet.connectors.request_control import CancelSet, RequestControl
from batchfleet.connectors.result_cache import RedisResultCache
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.connectors.rollout import Rollouts
from batchfleet.connectors.rollout_stats import RedisRolloutStats
from batchfleet.connectors.routes import ROUTE_TTL_S, RoutePlane
from batchfleet.connectors.values import DEFAULT_POOL_TIMEOUT_S, DEFAULT_TTL_S
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
    cancels: CancelSet
    routes: RoutePlane
    rollout_stats: RedisRolloutStats
    rollouts: Rollouts
    output_stats: RedisOutputStats
    quotas: QuotaGate
    bulk_jobs: RedisBulkJobs
    pipelines: RedisPipelineRegistry
    #: The URL it was opened with (``fleet`` compares it with the broker's).
    url: str = ""

    def request_control(self, broker: Broker) -> RequestControl:
        """Lanes on a client of the broker's Redis of its own (closed with it); none on
        a broker that is not Redis Streams."""
        from batchfleet.connectors.redis_broker import RedisBroker

        lanes = broker.client() if isinstance(broker, RedisBroker) else None
        return RequestControl(self.results, lanes)

    def fleet(self, broker: Broker) -> Any:
        from batchfleet.connectors.fleet import FleetReader
        from batchfleet.connectors.urls import BrokerURL

        return FleetReader(BrokerURL.parse(broker.url), self.url, self.results.names)

    async def close(self) -> None:
        await self.results.close()


def redis_control_plane(store: ResultStore, url: str = "") -> RedisControlPlane:
    """Every seam over the store's own client (one pool, closed with the store)."""
    client, names = store.redis, store.names
    letters, retries = DeadLetterQueue, RetrySchedule
    if is_cluster(client):  # a result record and a control-plane key: different slots
        from batchfleet.connectors.cluster_plane import (
            ClusterDeadLetterQueue,
            ClusterRetrySchedule,
        )

        letters, retries = ClusterDeadLetterQueue, ClusterRetrySchedule
    models, stats, heartbeats = (RedisModelRegistry(client, names),
                                 RedisRolloutStats(client, names), RedisHeartbeats(client, names))
    return RedisControlPlane(
        results=store, announcements=RedisAnnouncements(client, names),
        dead_letters=letters(client, names, store.ttl_s),
        undecodable=UndecodableSink(client, names), retry_schedule=retries(client, names),
        heartbeats=heartbeats, models=models, result_cache=RedisResultCache(client, names),
        cancels=CancelSet(client, names), routes=RoutePlane(client, names, ROUTE_TTL_S),
        rollout_stats=stats, rollouts=Rollouts(models, stats, heartbeats),
        output_stats=RedisOutputStats(client, names),
        quotas=QuotaGate(client, names, store.ttl_s),
        bulk_jobs=RedisBulkJobs(client, names, owns_client=False),
        pipelines=RedisPipelineRegistry(client, names), url=url)


def open_redis_control_plane(url: str, *, namespace: str = "bf",
                             result_ttl_s: int = DEFAULT_TTL_S,
                             max_connections: int | None = None,
                             pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S,
                             **_: Any) -> RedisControlPlane:
    """The ``batchfleet.control_planes`` factory; options it does not use are ignored."""
    from batchfleet.connectors.cluster_store import store_for
    from batchfleet.connectors.redis_client import names_for, redis_client

    url = url.strip()
    return redis_control_plane(
        store_for(redis_client(url, max_connections, pool_timeout_s),
                  names_for(url, Names(namespace)), result_ttl_s), url)
