"""How full a Redis is: memory against ``maxmemory``, its eviction policy, lane depths.

One pipeline (``INFO memory`` plus an ``XLEN`` per lane asked about), read by
producers' admission control (``producers.admission``) at most a few times a
second, and by readiness checks for the eviction policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import is_cluster
from batchfleet.connectors.values import StorePressure
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import Names

#: The store's pressure reading (``connectors.values``), read here from Redis.
RedisPressure = StorePressure


async def read_pressure(client: aioredis.Redis, names: Names,
                        lanes: Sequence[tuple[str, str]] = (),
                        shards: Mapping[str, int] | None = None) -> RedisPressure:
    """Memory, and each (model, lane)'s depth summed over its ``shards[model]`` streams."""
    cluster = is_cluster(client)
    pipe = client.pipeline(transaction=False)
    if not cluster:
        pipe.info("memory")
    counts = [(shards or {}).get(model, 1) for model, _ in lanes]
    for (model, lane), k in zip(lanes, counts, strict=True):
        for stream in names.shard_streams(model, lane, k):
            pipe.xlen(stream)
    with wrap_errors(TransportError, "cannot read Redis memory"):
        if cluster:  # the fullest primary is the one that refuses writes first
            lengths = await pipe.execute() if len(pipe) else []
            per_node = await client.info("memory", target_nodes="primaries")
            info = max(per_node.values(), key=_fullness)
        else:
            info, *lengths = await pipe.execute()
    depths: dict[tuple[str, str], int] = {}
    at = 0
    for key, k in zip(lanes, counts, strict=True):
        depths[key] = sum(int(n) for n in lengths[at:at + k])
        at += k
    policy = info.get("maxmemory_policy", "noeviction")
    return RedisPressure(
        int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)),
        policy.decode() if isinstance(policy, bytes) else str(policy), depths)


def _fullness(info: dict[str, Any]) -> float:
    limit = int(info.get("maxmemory", 0))
    return int(info.get("used_memory", 0)) / limit if limit else 0.0
