"""The Redis Streams broker (``redis``, ``rediss``, ``unix``, ``redis+cluster``), as the
``batchfleet.brokers`` entry points register it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchfleet.connectors.broker import Consumer, FinishTrip, OneTrip, Publisher
from batchfleet.connectors.redis_client import is_cluster_url, redis_client
from batchfleet.connectors.redis_streams import RedisStreamsConsumer, RedisStreamsPublisher
from batchfleet.connectors.values import DEFAULT_POOL_TIMEOUT_S
from batchfleet.schemas.names import Names


@dataclass(frozen=True, slots=True)
class RedisBroker:
    """A ``Broker``: each publisher and consumer on a client (pool) of its own."""

    url: str
    names: Names
    max_stream_len: int | None = None
    claim_idle_ms: int = 60_000
    max_connections: int | None = None
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S

    @property
    def cluster(self) -> bool:
        return is_cluster_url(self.url)

    def client(self) -> Any:
        """A new client of the broker's Redis (its holder closes it)."""
        return redis_client(self.url, self.max_connections, self.pool_timeout_s)

    def publisher(self) -> Publisher:
        if self.cluster:
            from batchfleet.connectors.cluster_streams import ClusterStreamsPublisher

            return ClusterStreamsPublisher(redis_client(self.url), self.names.for_cluster(),
                                           self.max_stream_len)
        return RedisStreamsPublisher(redis_client(self.url), self.names, self.max_stream_len)

    def _own_store(self, plane: Any) -> Any:
        """The plane's result store where the plane is this very (single-node) Redis, else
        None: not on a cluster (streams and records live in different slots), nor over
        another server, nor over a plane that is not the built-in Redis one (a wrapper
        counts)."""
        from batchfleet.connectors.redis_plane import RedisControlPlane
        from batchfleet.connectors.result_store import ResultStore

        if (isinstance(plane, RedisControlPlane) and plane.url == self.url
                and type(plane.results) is ResultStore and not self.cluster):
            return plane.results
        return None

    def one_trip(self, plane: Any) -> OneTrip | None:
        """One script call per chunk where the plane is this very Redis (:meth:`_own_store`)."""
        from batchfleet.connectors.redis_submit import OneTripSubmit

        store = self._own_store(plane)
        return None if store is None else OneTripSubmit(store, self.max_stream_len)

    def one_trip_finish(self, plane: Any, consumer: Consumer) -> FinishTrip | None:
        """The terminal write and the ack in one script call, on the same conditions as
        :meth:`one_trip`, for a consumer this broker made (``connectors.redis_finish``)."""
        from batchfleet.connectors.redis_finish import OneTripFinish

        store = self._own_store(plane)
        if store is None or type(consumer) is not RedisStreamsConsumer:
            return None
        return OneTripFinish(store, consumer.group)

    def consumer(self, consumer_name: str) -> Consumer:
        if self.cluster:
            from batchfleet.connectors.cluster_streams import ClusterStreamsConsumer

            return ClusterStreamsConsumer(redis_client(self.url), self.names.for_cluster(),
                                          consumer_name, claim_idle_ms=self.claim_idle_ms)
        return RedisStreamsConsumer(redis_client(self.url), self.names, consumer_name,
                                    claim_idle_ms=self.claim_idle_ms)


def open_redis_broker(url: str, *, namespace: str = "bf", max_stream_len: int | None = None,
                      claim_idle_ms: int = 60_000, max_connections: int | None = None,
                      pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S, **_: Any) -> RedisBroker:
    """The ``batchfleet.brokers`` factory; options it does not use are ignored."""
    return RedisBroker(url.strip(), Names(namespace), max_stream_len, claim_idle_ms,
                       max_connections, pool_timeout_s)
