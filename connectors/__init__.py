"""Broker adapters (Redis Streams, Kafka) and the Redis result store.

Both ``producers`` and ``workers`` use these; neither imports the other. The
``open_*`` factories are the only place that turns a URL into a transport.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from connectors.broker import Consumer, Delivery, LaneBacklog, OutboundMessage, Publisher
from connectors.redis_streams import RedisStreamsConsumer, RedisStreamsPublisher
from connectors.result_store import DEFAULT_TTL_S, ResultStore, SubmitState, TerminalWrite
from connectors.urls import BrokerURL, results_url_for
from schemas.names import Names


def redis_client(url: str) -> aioredis.Redis:
    """A binary-safe asyncio Redis client (hiredis-parsed when installed).

    Socket timeouts bound every call, so a wedged connection surfaces as an error
    (which the callers retry) instead of a hang; they sit far above XREADGROUP's
    100 ms BLOCK.
    """
    return aioredis.Redis.from_url(
        url, decode_responses=False, socket_keepalive=True, health_check_interval=30,
        socket_timeout=30, socket_connect_timeout=5,
    )


def open_result_store(url: str, names: Names, ttl_s: int = DEFAULT_TTL_S) -> ResultStore:
    return ResultStore(redis_client(url), names, ttl_s)


def open_publisher(
    broker: BrokerURL, names: Names, *, max_stream_len: int | None = None, partitions: int = 4
) -> Publisher:
    if broker.kind == "kafka":
        from connectors.kafka_publisher import KafkaPublisher

        return KafkaPublisher(broker.kafka_bootstrap, names, partitions=partitions)
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
        from connectors.kafka import KafkaConsumer

        return KafkaConsumer(broker.kafka_bootstrap, names, consumer_name, partitions=partitions,
                             session_timeout_ms=kafka_session_timeout_ms)
    return RedisStreamsConsumer(
        redis_client(broker.url), names, consumer_name, claim_idle_ms=claim_idle_ms
    )


__all__ = [
    "DEFAULT_TTL_S",
    "BrokerURL",
    "Consumer",
    "Delivery",
    "LaneBacklog",
    "OutboundMessage",
    "Publisher",
    "ResultStore",
    "SubmitState",
    "TerminalWrite",
    "open_consumer",
    "open_publisher",
    "open_result_store",
    "redis_client",
    "results_url_for",
]
