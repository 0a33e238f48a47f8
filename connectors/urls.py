"""Parsing of ``--broker`` and ``--results`` URLs into typed settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from batchfleet.connectors.redis_client import (
    CLUSTER_SCHEME,
    REDIS_SCHEMES,
    cluster_nodes,
    is_cluster_url,
)
from batchfleet.schemas.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """A parsed broker URL: ``redis://host:port/db``, ``redis+cluster://host:port[,host:port]``
    (Redis Cluster; ``kind`` is still ``redis``) or ``kafka://host:port[,host:port]``."""

    kind: Literal["redis", "kafka"]
    url: str

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port[,host:port]`` for aiokafka's ``bootstrap_servers``."""
        return self.url.split("://", 1)[1].rstrip("/")

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        scheme = urlsplit(url).scheme
        if scheme in REDIS_SCHEMES:
            if scheme == CLUSTER_SCHEME:
                cluster_nodes(url)  # refuse a malformed host list here, not at first use
            return cls("redis", url)
        if scheme == "kafka":
            hosts = url.split("://", 1)[1].rstrip("/")
            if not hosts or any(":" not in h for h in hosts.split(",")):
                raise ConfigError(f"kafka URL {url!r} must look like kafka://host:port[,host:port]")
            return cls("kafka", url)
        raise ConfigError(
            f"broker URL {url!r} must start with redis://, rediss://, redis+cluster:// or kafka:// "
            "(for example redis://localhost:6379/0)"
        )


def results_url_for(broker: BrokerURL, results: str | None) -> str:
    """The result store's URL: given explicitly, or the broker's when the broker is Redis.

    A Redis broker and the result store are both Redis Cluster or both not: the request
    control plane reads both with one set of key names."""
    if results:
        scheme = urlsplit(results).scheme
        if scheme not in REDIS_SCHEMES:
            raise ConfigError(
                f"results URL {results!r} must be a redis:// or redis+cluster:// URL")
        if scheme == CLUSTER_SCHEME:
            cluster_nodes(results)
        if broker.kind == "redis" and is_cluster_url(broker.url) != (scheme == CLUSTER_SCHEME):
            raise ConfigError(
                "a Redis broker and the result store must both be Redis Cluster "
                "(redis+cluster://) or both not; mixing them is not supported")
        return results
    if broker.kind == "redis":
        return broker.url
    raise ConfigError(
        "a Kafka broker needs a result store: pass --results redis://host:port/db "
        "or set BATCHFLEET_RESULTS"
    )
