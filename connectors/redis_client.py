"""The one place a Redis URL becomes a client: single node or Redis Cluster.

``redis://``, ``rediss://`` and ``unix://`` give ``redis.asyncio.Redis``;
``redis+cluster://host:port[,host:port...]`` gives ``redis.asyncio.cluster.RedisCluster``,
which follows MOVED/ASK redirections and re-reads the topology after a failover, so
nothing in batchfleet routes by hand. How it is configured for a failover (no
retries inside the library, a topology refresh after a failed pipeline) is explained
at :class:`FleetRedisCluster`.

The cluster client is returned typed as ``aioredis.Redis``: it offers the same command
API, and the seams that hold a client need not change. Code that must behave
differently on a cluster (multi-slot scripts, transactions, pub/sub) asks
:func:`is_cluster`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import structlog
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import ConnectionError, MaxConnectionsError, RedisError

from batchfleet.connectors.redis_connection import fleet_connection
from batchfleet.connectors.values import DEFAULT_POOL_TIMEOUT_S
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names

CLUSTER_SCHEME = "redis+cluster"
#: Every scheme a ``--results`` (or Redis ``--broker``) URL may use.
REDIS_SCHEMES = ("redis", "rediss", "unix", CLUSTER_SCHEME)
log = structlog.get_logger(__name__)

#: A client's connections to one Redis, unless told otherwise (redis-py's own default
#: cap, which it enforces by *failing* "Too many connections" past it).
DEFAULT_MAX_CONNECTIONS = 100
#: How long a command waits for a free pooled connection before it fails.

_OPTIONS: dict[str, Any] = {
    "decode_responses": False, "socket_timeout": 30, "socket_connect_timeout": 5}
#: TCP's own: a ``unix://`` connection refuses them (redis-py raises ``TypeError`` on the
#: first command, so a worker over a Unix socket died at start-up).
_TCP_OPTIONS: dict[str, Any] = {"socket_keepalive": True}


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme == CLUSTER_SCHEME


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """Seed ``(host, port)`` pairs, user and password of a ``redis+cluster://`` URL."""
    rest = url.split("://", 1)[1]
    user = password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        user, _, password = auth.partition(":")
        user, password = unquote(user) or None, unquote(password) or None
    hosts, _, db = rest.partition("/")
    if db.strip("/") not in ("", "0"):
        raise ConfigError(f"Redis Cluster URL {url!r}: a cluster has only database 0")
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"Redis Cluster URL {url!r} must look like redis+cluster://host:port[,host:port]")
        nodes.append((host, int(port)))
    return nodes, user, password


def is_cluster(client: Any) -> bool:
    """Whether a client talks to a Redis Cluster (async or sync)."""
    return isinstance(client, RedisCluster | SyncRedisCluster)


def names_for(url: str, names: Names) -> Names:
    """The names a client of ``url`` uses: with cluster hash tags on a cluster."""
    return names.for_cluster(is_cluster_url(url))


class FleetPipeline(ClusterPipeline):
    """A cluster pipeline that re-reads the topology when a node fails under it.

    With no retries inside the library (see :class:`FleetRedisCluster`), a pipeline that
    meets a dead primary raises without marking the slot map stale, so every later
    pipeline would dial the same dead node. Re-reading the map here, once per failure,
    lets the caller's retry find the promoted replica.
    """

    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        try:
            replies = await super().execute(raise_on_error, allow_redirections)
        except RedisCluster.ERRORS_ALLOW_RETRY:
            await refresh_topology(self.cluster_client)
            raise
        except AttributeError as exc:
            # redis-py 8.1 still closes every node's connections on some cluster errors
            # (CLUSTERDOWN, an uncovered slot); a pipeline caught mid-send then meets a
            # connection whose writer is gone. That is a lost connection: say so, so the
            # caller's retry (which knows ConnectionError, not AttributeError) runs.
            await refresh_topology(self.cluster_client)
            raise ConnectionError(f"connection closed under a pipeline: {exc}") from exc
        if any(isinstance(r, RedisCluster.ERRORS_ALLOW_RETRY) for r in replies):
            await refresh_topology(self.cluster_client)  # raise_on_error=False
        return replies


class FleetRedisCluster(RedisCluster):
    """``RedisCluster`` configured to survive a primary's failover while shared by tasks.

    redis-py 8.1 retries a failed command or pipeline inside the client, but ignores
    the ``Retry`` backoff there: a command retries at once, a pipeline after a fixed
    0.25 s, so its retries are spent long before a replica is promoted (node timeout
    plus an election, seconds). Worse, each retry of a *pipeline* closes every
    connection of every node (``RedisCluster.aclose``), including those other tasks are
    using at that moment; a task caught connecting then fails with ``AttributeError``
    instead of a ``ConnectionError``, which no retry recognises. So the client is built with no
    retries: a command or pipeline that meets a dead node fails at once with a
    ``ConnectionError``, the slot map is marked stale (by the library for a command,
    by :class:`FleetPipeline` for a pipeline), and the caller retries with its own
    backoff until the promoted replica answers, as it does on a single node.

    Its nodes' connections are :func:`fleet_connection`'s, as a single node's are: the
    nodes it learns from the slot map are built from ``connection_kwargs``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.nodes_manager.connection_kwargs
        options["connection_class"] = fleet_connection(options["connection_class"])
        for node in self.nodes_manager.startup_nodes.values():  # no connection made yet
            node.connection_class = options["connection_class"]

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # the library refuses it
        # redis-py's typing declares ``_event_dispatcher`` abstract on a pipeline's
        # mixins, though ``ClusterPipeline`` works as built: the library builds it alike.
        return FleetPipeline(self, transaction)  # type: ignore[abstract]


async def refresh_topology(client: RedisCluster) -> None:
    """Re-read the slot map from a live node, best effort: when no node answers, the
    caller's own error says more, and its next retry tries again."""
    try:
        await client.nodes_manager.initialize()
    except (RedisError, OSError) as exc:
        log.debug("cannot re-read the cluster topology yet", error=str(exc))


class WaitingPool(aioredis.BlockingConnectionPool):
    """A bounded pool whose callers queue for a free connection.

    redis-py's default ``ConnectionPool`` caps a client at 100 connections and fails
    every command past that ("Too many connections"): 500 concurrent submits from one
    client lost 400 of them. Here they wait, up to ``timeout``, and only a wait that
    runs out fails, saying why (every connection stayed busy) and what to change.
    """

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection()  # type: ignore[no-untyped-call]
        except ConnectionError as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
            raise MaxConnectionsError(
                f"no Redis connection came free within {self.timeout}s: all "
                f"{self.max_connections} of this client's pool stayed busy (raise "
                "redis_max_connections or redis_pool_timeout_s, or send fewer at once)"
            ) from exc


def redis_client(url: str, max_connections: int | None = None,
                 pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S) -> aioredis.Redis:
    """A binary-safe asyncio Redis client (hiredis-parsed when installed).

    Socket timeouts bound every call, so a wedged connection surfaces as an error
    (which the callers retry) instead of a hang; they sit far above XREADGROUP's
    100 ms BLOCK. The pool holds up to ``max_connections`` (default
    ``DEFAULT_MAX_CONNECTIONS``) and a command past them waits up to ``pool_timeout_s``
    for a free one (:class:`WaitingPool`); on a cluster it caps each node's pool.
    """
    if is_cluster_url(url):
        nodes, user, password = cluster_nodes(url)
        cluster = FleetRedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in nodes], username=user,
            password=password, max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
            retry=Retry(NoBackoff(), 0), **_OPTIONS, **_TCP_OPTIONS)
        return cast(aioredis.Redis, cluster)
    tcp = {} if urlsplit(url).scheme == "unix" else _TCP_OPTIONS
    options = {**_OPTIONS, **tcp, "health_check_interval": 30}
    pool = WaitingPool.from_url(url, max_connections=max_connections or DEFAULT_MAX_CONNECTIONS,
                                timeout=pool_timeout_s, **options)
    pool.connection_class = fleet_connection(pool.connection_class)
    return aioredis.Redis.from_pool(pool)


#: Hosts that are this machine.
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def local_server_pid(url: str) -> int | None:
    """The process ID a Redis on this machine reports (``INFO server``), for a tool that
    measures its CPU (the bench): over a Unix socket or a loopback host only. None for a
    remote host, a cluster, or a server that does not answer within 2 s."""
    parts = urlsplit(url)
    if parts.scheme != "unix" and not (parts.scheme == "redis" and parts.hostname in _LOOPBACK):
        return None
    try:
        with redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0) as c:
            pid = int(c.info("server")["process_id"])
    except (RedisError, OSError, KeyError, ValueError):
        return None
    return pid if pid > 0 else None


def sync_redis_client(url: str) -> redis.Redis:
    """The synchronous twin of :func:`redis_client`, for process launchers and probes."""
    if is_cluster_url(url):
        nodes, user, password = cluster_nodes(url)
        seeds = [SyncClusterNode(h, p) for h, p in nodes]  # type: ignore[no-untyped-call]
        return cast(redis.Redis, SyncRedisCluster(
            startup_nodes=seeds, username=user,
            password=password, **_OPTIONS, **_TCP_OPTIONS))
    return redis.Redis.from_url(url)


async def queue_script(pipe: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]
                       ) -> None:
    """Queue a registered script in a pipeline. A cluster pipeline refuses ``EVALSHA``
    (and a promoted replica's script cache starts empty), so there it is ``EVAL``."""
    if isinstance(pipe, ClusterPipeline):
        pipe.eval(script.script, len(keys), *keys, *args)
    else:
        await script(keys=keys, args=args, client=pipe)
