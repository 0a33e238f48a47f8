"""Bulk job records in Redis: one hash per job, a lease key, and an index for listing.

``producers.bulk.state`` owns what the fields mean (checkpoint, status, identity);
this module only stores them. Every write by a running job goes through one Lua
call that checks the lease first (:meth:`RedisBulkJobs.fenced_write`), so a
process that lost its job to another can never move the checkpoint. Field values
come back decoded (``str``); a missing job reads as an empty mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.typing import EncodableT

from batchfleet.connectors.errors import wrap_errors
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

_FENCED_HSET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if #ARGV > 3 then redis.call('HSET', KEYS[2], unpack(ARGV, 4)) end
redis.call('EXPIRE', KEYS[2], ARGV[3])
return tonumber(redis.call('HGET', KEYS[2], 'cancel') or 0)
"""
_STEAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decoded(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _mapping(fields: Mapping[str, Any]) -> dict[EncodableT, EncodableT]:
    return {key: "" if value is None else value for key, value in fields.items()}


def _flat(fields: Mapping[str, Any]) -> list[Any]:
    """HSET arguments; ``None`` is stored as the empty string (a cleared field)."""
    flat: list[Any] = []
    for key, value in fields.items():
        flat += [key, "" if value is None else value]
    return flat


class RedisBulkJobs:
    """A ``BulkJobStore`` over one Redis client (owned: :meth:`close` closes it; a control
    plane's shares the plane's client, which the plane closes)."""

    def __init__(self, client: aioredis.Redis, names: Names, *, owns_client: bool = True
                 ) -> None:
        self._redis, self._names = client, names
        self._owns_client = owns_client
        self._fenced = client.register_script(_FENCED_HSET)
        self._steal = client.register_script(_STEAL)
        self._release = client.register_script(_RELEASE)

    async def take_lease(self, job_id: str, token: str, ttl_s: int) -> str | None:
        """Take a free lease: ``None`` when taken, else the current holder ("" if it
        expired between the two calls)."""
        lease = self._names.bulk_lease(job_id)
        with wrap_errors(ResultStoreError, f"cannot claim bulk job {job_id}"):
            if await self._redis.set(lease, token, nx=True, ex=ttl_s):
                return None
            return _text(await self._redis.get(lease) or b"")

    async def steal_lease(self, job_id: str, holder: str, token: str, ttl_s: int) -> bool:
        """Take the lease from ``holder`` (known dead), only if it still holds it."""
        with wrap_errors(ResultStoreError, f"cannot claim bulk job {job_id}"):
            return bool(await self._steal(keys=[self._names.bulk_lease(job_id)],
                                          args=[holder, token, ttl_s]))

    async def release_lease(self, job_id: str, token: str) -> None:
        with wrap_errors(ResultStoreError, f"cannot release bulk job {job_id}"):
            await self._release(keys=[self._names.bulk_lease(job_id)], args=[token])

    async def fields(self, job_id: str) -> dict[str, str]:
        with wrap_errors(ResultStoreError, f"cannot read bulk job {job_id}"):
            return _decoded(await self._redis.hgetall(self._names.bulk_job(job_id)))

    async def read(self, job_id: str) -> tuple[dict[str, str], str | None]:
        """The job's fields and its lease holder (``None`` when nobody holds it)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(self._names.bulk_job(job_id))
        pipe.get(self._names.bulk_lease(job_id))
        with wrap_errors(ResultStoreError, f"cannot read bulk job {job_id}"):
            raw, owner = await pipe.execute()
        return _decoded(raw), _text(owner) if owner else None

    async def create(self, job_id: str, fields: Mapping[str, Any], created_at: float) -> None:
        """Write a new job's first fields and index it for listing."""
        with wrap_errors(ResultStoreError, f"cannot claim bulk job {job_id}"):
            await self._redis.hset(self._names.bulk_job(job_id), mapping=_mapping(fields))
            await self._redis.zadd(self._names.bulk_jobs, {job_id: created_at})

    async def fenced_write(self, job_id: str, token: str, fields: Mapping[str, Any],
                           lease_ttl_s: int, job_ttl_s: int) -> int:
        """HSET if ``token`` holds the lease (refreshing both TTLs): -1 when it does not,
        else the job's cancel flag (0 or 1)."""
        with wrap_errors(ResultStoreError, "cannot write bulk job state"):
            return int(await self._fenced(
                keys=[self._names.bulk_lease(job_id), self._names.bulk_job(job_id)],
                args=[token, lease_ttl_s, job_ttl_s, *_flat(fields)]))

    async def write(self, job_id: str, fields: Mapping[str, Any]) -> None:
        """Unfenced HSET, for operators (``bulk cancel``), who hold no lease."""
        with wrap_errors(ResultStoreError, f"cannot update bulk job {job_id}"):
            await self._redis.hset(self._names.bulk_job(job_id), mapping=_mapping(fields))

    async def recent(self, limit: int) -> list[str]:
        """Job IDs, newest first (some may name records that have expired)."""
        with wrap_errors(ResultStoreError, "cannot list bulk jobs"):
            ids = await self._redis.zrevrange(self._names.bulk_jobs, 0, max(0, limit - 1))
        return [_text(i) for i in ids]

    async def index_shard(self, job_id: str, record_id: str, started_at: float,
                          ttl_s: int) -> None:
        """Note that ``record_id`` is one shard of ``job_id`` (kept as long as its records)."""
        key = self._names.bulk_shards(job_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.zadd(key, {record_id: started_at}, nx=True)
        pipe.expire(key, ttl_s)
        with wrap_errors(ResultStoreError, f"cannot index a shard of bulk job {job_id}"):
            await pipe.execute()

    async def shards_of(self, job_id: str) -> list[str]:
        """The shard record IDs of ``job_id``, in the order they started."""
        with wrap_errors(ResultStoreError, f"cannot read the shards of bulk job {job_id}"):
            ids = await self._redis.zrange(self._names.bulk_shards(job_id), 0, -1)
        return [_text(i) for i in ids]

    async def unindex(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            with wrap_errors(ResultStoreError, "cannot list bulk jobs"):
                await self._redis.zrem(self._names.bulk_jobs, *job_ids)

    async def close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()


def open_bulk_jobs(url: str, names: Names) -> RedisBulkJobs:
    from batchfleet.connectors.redis_client import names_for, redis_client

    return RedisBulkJobs(redis_client(url), names_for(url, names))
