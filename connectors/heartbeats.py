"""Worker heartbeats in Redis, found without scanning the keyspace.

Each worker's record is a key with a TTL (``Names.worker_heartbeat``), so a dead
worker drops out on its own. Beside it a sorted set of worker IDs scored by last
beat (``Names.live_workers``) lets readers find the live ones in one ``ZRANGEBYSCORE``
plus one ``MGET``, whatever else the database holds; writers prune members older
than the TTL, so the set stays as small as the fleet.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import names_for, sync_redis_client
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.heartbeat import HeartbeatRecord, decode_heartbeat, encode_heartbeat
from batchfleet.schemas.names import Names


class RedisHeartbeats:
    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names
        self._set = names.live_workers

    @wrap_errors(ResultStoreError, "cannot write the heartbeat")
    async def write(self, worker_id: str, info: Mapping[str, Any], ttl_s: int) -> bool:
        """Store this beat; True when the previous one was still there (False on the first
        beat, or after Redis lost its data)."""
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._names.worker_heartbeat(worker_id), encode_heartbeat(info), ex=ttl_s,
                 get=True)
        pipe.zadd(self._set, {worker_id: now})
        pipe.zremrangebyscore(self._set, "-inf", now - ttl_s)
        pipe.expire(self._set, ttl_s * 6)
        previous, *_ = await pipe.execute()
        return previous is not None

    @wrap_errors(ResultStoreError, "cannot read heartbeats")
    async def read_all(self, ttl_s: int = 10) -> list[HeartbeatRecord]:
        """Every live worker's record: two round trips at any fleet or keyspace size."""
        ids: list[Any] = await self._redis.zrangebyscore(self._set, time.time() - ttl_s, "+inf")
        if not ids:
            return []
        raws: list[Any] = await self._redis.mget(
            [self._names.worker_heartbeat(w.decode()) for w in ids])
        records = (decode_heartbeat(raw) for raw in raws if raw)
        return [r for r in records if r is not None]

    @wrap_errors(ResultStoreError, "cannot remove the heartbeat")
    async def forget(self, worker_id: str) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(self._names.worker_heartbeat(worker_id))
        pipe.zrem(self._set, worker_id)
        await pipe.execute()


class HeartbeatProbe:
    """Synchronous "is this worker beating?" for process launchers (no event loop needed)."""

    def __init__(self, url: str, names: Names) -> None:
        self._redis = sync_redis_client(url)
        self._names = names_for(url, names)

    def present(self, worker_id: str) -> bool:
        with wrap_errors(ResultStoreError, "cannot read the heartbeat"):
            return bool(self._redis.exists(self._names.worker_heartbeat(worker_id)))

    def close(self) -> None:
        self._redis.close()
