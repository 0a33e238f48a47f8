"""Shared fixtures: real redis-server processes on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from tests.support.kafka import kafka_broker, kafka_server  # noqa: F401  (fixture re-exports)
from tests.support.redis_cluster import RedisClusterServers
from tests.support.transports import Fleet, make_fleet


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:
    """A fresh redis-server per test, so tests can stop, kill and restart it."""
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture(params=["redis", pytest.param("kafka", marks=pytest.mark.kafka)])
def fleet(request: pytest.FixtureRequest, redis_url: str) -> Fleet:
    """Broker, result store and a fresh namespace, once per transport."""
    kind = str(request.param)
    bootstrap = request.getfixturevalue("kafka_broker") if kind == "kafka" else None
    return make_fleet(kind, redis_url, bootstrap)


@pytest.fixture(scope="session")
def redis_cluster_servers() -> Iterator[RedisClusterServers]:
    """One Redis Cluster (3 primaries, 3 replicas) for the session: each test uses a fresh
    namespace on it. Tests that kill a node use ``fresh_redis_cluster`` instead."""
    with RedisClusterServers() as servers:
        yield servers


@pytest.fixture
def fresh_redis_cluster() -> Iterator[RedisClusterServers]:
    """A Redis Cluster of its own, for a test that SIGKILLs a primary."""
    with RedisClusterServers() as servers:
        yield servers


@pytest.fixture
def cluster_fleet(redis_cluster_servers: RedisClusterServers) -> Fleet:
    """Broker and result store on the session's Redis Cluster, a fresh namespace."""
    return make_fleet("redis", redis_cluster_servers.url, None)
