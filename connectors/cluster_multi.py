"""``MULTI``/``EXEC`` that also works on a Redis Cluster client that is still new.

redis-py's async cluster pipeline in transaction mode (8.1,
``TransactionStrategy.execute_command``) queues each command through ``asyncio.run``
in a throwaway thread. A client that has not read the cluster's topology yet reads
it *there*, so its node connections belong to an event loop that closes as soon as
the command is queued: the ``EXEC``, and every later command of that client, then
fail ("attached to a different loop", "Event loop is closed"). A CLI command whose
first call is a transaction (``models declare``) met exactly that. Reading the
topology first, on the caller's loop, avoids it.

Every transaction batchfleet runs touches control-plane keys only, which share one
hash tag on a cluster (``Names.plane``), so ``MULTI`` stays within one slot.
"""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster

from batchfleet.connectors.redis_client import is_cluster


async def transaction(client: aioredis.Redis) -> Pipeline:
    """A ``MULTI``/``EXEC`` pipeline; on a cluster, once the client knows the topology."""
    if is_cluster(client):
        await cast(RedisCluster, client).initialize()
    return client.pipeline(transaction=True)
