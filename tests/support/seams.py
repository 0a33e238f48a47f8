"""Test-only shortcuts to the Redis implementations behind the doors.

Production code reaches a backend only through ``connectors.open_control_plane`` and
``connectors.open_broker``. Tests of the Redis classes themselves (and tests that check
raw state) want one seam over a store they hold, or a publisher for a ``BrokerURL``:
these build exactly that, from the same classes the doors use.
"""

from __future__ import annotations

from typing import Any

from batchfleet.connectors import Consumer, Publisher, open_broker
from batchfleet.connectors.cluster_store import store_for
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.redis_broker import RedisBroker
from batchfleet.connectors.redis_client import names_for, redis_client
from batchfleet.connectors.redis_plane import RedisControlPlane, redis_control_plane
from batchfleet.connectors.redis_submit import OneTripSubmit
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.rollout_stats import RedisRolloutStats
from batchfleet.connectors.routes import RoutePlane
from batchfleet.connectors.urls import BrokerURL
from batchfleet.connectors.values import DEFAULT_POOL_TIMEOUT_S, DEFAULT_TTL_S
from batchfleet.schemas.names import Names


def open_result_store(url: str, names: Names, ttl_s: int = DEFAULT_TTL_S,
                      max_connections: int | None = None,
                      pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S) -> ResultStore:
    return store_for(redis_client(url, max_connections, pool_timeout_s),
                     names_for(url, names), ttl_s)


def control_plane_for(store: ResultStore) -> RedisControlPlane:
    return redis_control_plane(store)


def model_registry_for(store: ResultStore) -> RedisModelRegistry:
    return RedisModelRegistry(store.redis, store.names)


def rollout_stats_for(store: ResultStore) -> RedisRolloutStats:
    return RedisRolloutStats(store.redis, store.names)


def route_plane_for(store: ResultStore, ttl_s: int) -> RoutePlane:
    return RoutePlane(store.redis, store.names, ttl_s)


def one_trip_for(store: ResultStore, publisher: object, same_server: bool,
                 max_stream_len: int | None = None) -> OneTripSubmit | None:
    """What the Redis broker's ``one_trip`` answers, for a store and publisher in hand."""
    from batchfleet.connectors.redis_streams import RedisStreamsPublisher

    if same_server and type(store) is ResultStore and type(publisher) is RedisStreamsPublisher:
        return OneTripSubmit(store, max_stream_len)
    return None


def _door(broker: BrokerURL, names: Names, **options: Any) -> Any:
    return open_broker(broker.url, namespace=names.prefix, **options)


def open_publisher(broker: BrokerURL, names: Names, *, max_stream_len: int | None = None,
                   partitions: int = 4) -> Publisher:
    door = _door(broker, names, max_stream_len=max_stream_len, partitions=partitions)
    return door.publisher()  # type: ignore[no-any-return]


def open_consumer(broker: BrokerURL, names: Names, consumer_name: str, *,
                  claim_idle_ms: int = 60_000, partitions: int = 4,
                  kafka_session_timeout_ms: int = 10_000) -> Consumer:
    door = _door(broker, names, claim_idle_ms=claim_idle_ms, partitions=partitions,
                 session_timeout_ms=kafka_session_timeout_ms)
    return door.consumer(consumer_name)  # type: ignore[no-any-return]


__all__ = ["RedisBroker", "control_plane_for", "model_registry_for", "one_trip_for",
           "open_consumer", "open_publisher", "open_result_store", "rollout_stats_for",
           "route_plane_for"]
