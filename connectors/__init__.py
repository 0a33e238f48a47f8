"""Broker adapters (Redis Streams, Kafka) and the control plane (Redis today).

Both ``producers`` and ``workers`` use these; neither imports the other. The
``open_*`` factories are the only place that turns a URL into a transport, and
nothing above this package holds a driver client (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from batchfleet.connectors.broker import Consumer, Delivery, LaneBacklog, OutboundMessage, Publisher
from batchfleet.connectors.control_plane import FACTORIES, ControlPlane, open_control_plane
from batchfleet.connectors.redis_client import (
    DEFAULT_POOL_TIMEOUT_S,
    is_cluster_url,
    names_for,
    redis_client,
)
from batchfleet.connectors.redis_plane import RedisControlPlane, redis_control_plane
from batchfleet.connectors.redis_streams import RedisStreamsConsumer, RedisStreamsPublisher
from batchfleet.connectors.result_store import (
    DEFAULT_TTL_S,
    ResultStore,
    SubmitState,
    TerminalWrite,
)
from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names


def open_result_store(url: str, names: Names, ttl_s: int = DEFAULT_TTL_S,
                      max_connections: int | None = None,
                      pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S) -> ResultStore:
    from batchfleet.connectors.cluster_store import store_for

    return store_for(redis_client(url, max_connections, pool_timeout_s),
                     names_for(url, names), ttl_s)


def control_plane_for(store: ResultStore) -> RedisControlPlane:
    """Every control-plane seam over an open result store's connections."""
    return redis_control_plane(store)


@contextmanager
def _kafka_extra() -> Iterator[None]:
    """aiokafka is an extra: a kafka:// URL without it is a config error that names it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "aiokafka":
            raise
        raise ConfigError(
            "kafka:// brokers need the kafka extra: pip install 'batchfleet[kafka]'") from exc


def open_publisher(
    broker: BrokerURL, names: Names, *, max_stream_len: int | None = None, partitions: int = 4
) -> Publisher:
    if broker.kind == "kafka":
        with _kafka_extra():
            from batchfleet.connectors.kafka_publisher import KafkaPublisher

        return KafkaPublisher(broker.kafka_bootstrap, names, partitions=partitions)
    if is_cluster_url(broker.url):
        from batchfleet.connectors.cluster_streams import ClusterStreamsPublisher

        return ClusterStreamsPublisher(redis_client(broker.url), names.for_cluster(),
                                       max_stream_len)
    return RedisStreamsPublisher(redis_client(broker.url), names, max_stream_len)


def open_consumer(
    broker: BrokerURL,
    names: Names,
    consumer_name: str,
    *,
    claim_idle_ms: int = 60_000,
    partitions: int = 4,
    kafka_session_timeout_ms: int = 10_000,
) -> Consumer:
    if broker.kind == "kafka":
        with _kafka_extra():
            from batchfleet.connectors.kafka import KafkaConsumer

        return KafkaConsumer(broker.kafka_bootstrap, names, consumer_name, partitions=partitions,
                             session_timeout_ms=kafka_session_timeout_ms)
    if is_cluster_url(broker.url):
        from batchfleet.connectors.cluster_streams import ClusterStreamsConsumer

        return ClusterStreamsConsumer(redis_client(broker.url), names.for_cluster(),
                                      consumer_name, claim_idle_ms=claim_idle_ms)
    return RedisStreamsConsumer(
        redis_client(broker.url), names, consumer_name, claim_idle_ms=claim_idle_ms
    )


__all__ = [
    "DEFAULT_TTL_S",
    "FACTORIES",
    "BrokerURL",
    "Consumer",
    "ControlPlane",
    "Delivery",
    "LaneBacklog",
    "OutboundMessage",
    "Publisher",
    "ResultStore",
    "SubmitState",
    "TerminalWrite",
    "control_plane_for",
    "open_consumer",
    "open_control_plane",
    "open_publisher",
    "open_result_store",
    "redis_client",
    "results_url_for",
]
