"""A bulk job's durable state in Redis: identity, checkpoint, status, lease and cancel flag.

One hash per job holds everything ``bulk status`` shows and everything a resume
needs (the :class:`Position` checkpoint, and ``published``: every row below it
was put on the broker, so a resume waits for those instead of publishing them
again). A sorted set indexes the jobs for ``bulk list``.

Only the holder of the job's *lease* (a key with a TTL, refreshed while the job
runs) may write: every write is one Lua call that checks the lease first, so a
process that lost its job to another can never move the checkpoint. A lease
whose holder died on this host is taken over at once; one held elsewhere must
expire (``LEASE_TTL_S``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT

from producers.bulk.errors import JobConflictError, LeaseLostError
from producers.bulk.rows import Position
from producers.bulk.spec import JobSpec
from schemas.errors import ResultStoreError
from schemas.names import Names

LEASE_TTL_S: Final = 15
#: Job records outlive their results (24 h) so a finished job can still be listed and retried.
JOB_TTL_S: Final = 30 * 24 * 3600
ACTIVE: Final = frozenset({"running", "retrying"})

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


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    status: str
    identity: dict[str, Any]
    position: Position
    total: int | None
    published: int
    retry_round: int
    created_at: float
    updated_at: float
    finished_at: float | None
    error: str
    cancel_requested: bool
    owner: str | None

    @property
    def live(self) -> bool:
        return self.owner is not None and not _holder_is_dead_here(self.owner)

    @property
    def display_status(self) -> str:
        """``interrupted``: the record says running but nobody holds the lease (it crashed)."""
        return "interrupted" if self.status in ACTIVE and not self.live else self.status

    @classmethod
    def parse(cls, job_id: str, raw: Mapping[Any, Any], owner: Any) -> JobRecord:
        f = {_text(k): _text(v) for k, v in raw.items()}
        return cls(
            job_id=job_id, status=f.get("status", "unknown"),
            identity=json.loads(f.get("identity", "{}")), position=Position.from_fields(f),
            total=int(f["total"]) if f.get("total") else None,
            published=int(f.get("published") or 0), retry_round=int(f.get("round") or 0),
            created_at=float(f.get("created_at") or 0), updated_at=float(f.get("updated_at") or 0),
            finished_at=float(f["finished_at"]) if f.get("finished_at") else None,
            error=f.get("error", ""), cancel_requested=f.get("cancel") == "1",
            owner=_text(owner) if owner else None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _holder_is_dead_here(owner: str) -> bool:
    host, _, rest = owner.partition("|")
    pid = rest.partition("|")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class JobStore:
    def __init__(self, client: aioredis.Redis, names: Names, job_id: str) -> None:
        self._redis, self._names, self.job_id = client, names, job_id
        self._key, self._lease = names.bulk_job(job_id), names.bulk_lease(job_id)
        self.token = f"{socket.gethostname()}|{os.getpid()}|{uuid.uuid4().hex[:8]}"
        self._fenced = client.register_script(_FENCED_HSET)
        self._steal = client.register_script(_STEAL)
        self._release = client.register_script(_RELEASE)

    async def claim(self, spec: JobSpec, total: int | None) -> JobRecord:
        """Take the job's lease and create or load its record; refuse a mismatched spec."""
        try:
            if not await self._redis.set(self._lease, self.token, nx=True, ex=LEASE_TTL_S):
                holder = _text(await self._redis.get(self._lease) or b"")
                if not (holder and _holder_is_dead_here(holder) and await self._steal(
                        keys=[self._lease], args=[holder, self.token, LEASE_TTL_S])):
                    raise JobConflictError(f"job {self.job_id} is already running ({holder}); "
                                           "cancel it or wait for it")
            raw = await self._redis.hgetall(self._key)
            if not raw:
                now = time.time()
                await self._redis.hset(self._key, mapping={
                    "identity": json.dumps(spec.identity()), "status": "running",
                    "created_at": now, "updated_at": now, "total": total or ""})
                await self._redis.zadd(self._names.bulk_jobs, {self.job_id: now})
                raw = await self._redis.hgetall(self._key)
        except RedisError as exc:
            raise ResultStoreError(f"cannot claim bulk job {self.job_id}: {exc}") from exc
        record = JobRecord.parse(self.job_id, raw, self.token.encode())
        if record.identity != spec.identity():
            await self.release()
            diff = sorted(k for k, v in spec.identity().items() if record.identity.get(k) != v)
            raise JobConflictError(f"job {self.job_id} was started with a different "
                                   f"{', '.join(diff)}; use a new job ID")
        return record

    async def write(self, **fields: Any) -> bool:
        """Fenced HSET (plus ``updated_at``); returns whether a cancel was requested."""
        flat: list[Any] = []
        for key, value in {**fields, "updated_at": time.time()}.items():
            flat += [key, "" if value is None else value]
        try:
            cancel = await self._fenced(keys=[self._lease, self._key],
                                        args=[self.token, LEASE_TTL_S, JOB_TTL_S, *flat])
        except RedisError as exc:
            raise ResultStoreError(f"cannot write bulk job state: {exc}") from exc
        if int(cancel) < 0:
            raise LeaseLostError(f"job {self.job_id} was taken over by another process")
        return bool(int(cancel))

    async def checkpoint(self, pos: Position, **fields: Any) -> bool:
        return await self.write(**pos.to_fields(), **fields)

    async def release(self) -> None:
        with contextlib.suppress(RedisError):  # else it expires within LEASE_TTL_S
            await self._release(keys=[self._lease], args=[self.token])


async def load_job(client: aioredis.Redis, names: Names, job_id: str) -> JobRecord | None:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(names.bulk_job(job_id))
    pipe.get(names.bulk_lease(job_id))
    try:
        raw, owner = await pipe.execute()
    except RedisError as exc:
        raise ResultStoreError(f"cannot read bulk job {job_id}: {exc}") from exc
    return JobRecord.parse(job_id, raw, owner) if raw else None


async def list_jobs(client: aioredis.Redis, names: Names, limit: int = 50
                    ) -> list[JobRecord]:
    """Newest first; index entries whose record expired are dropped on the way."""
    try:
        ids = [_text(i) for i in await client.zrevrange(names.bulk_jobs, 0, max(0, limit - 1))]
    except RedisError as exc:
        raise ResultStoreError(f"cannot list bulk jobs: {exc}") from exc
    records = [await load_job(client, names, job_id) for job_id in ids]
    gone = [job_id for job_id, r in zip(ids, records, strict=True) if r is None]
    if gone:
        await client.zrem(names.bulk_jobs, *gone)
    return [r for r in records if r is not None]


async def request_cancel(client: aioredis.Redis, names: Names, job_id: str
                         ) -> JobRecord | None:
    """Flag the job; a live run stops at its next checkpoint. A dead one is marked at once."""
    record = await load_job(client, names, job_id)
    if record is None:
        return None
    mapping: dict[EncodableT, EncodableT] = {"cancel": 1, "updated_at": time.time()}
    if record.status in ACTIVE and not record.live:
        mapping.update(status="cancelled", finished_at=time.time())
    try:
        await client.hset(names.bulk_job(job_id), mapping=mapping)
    except RedisError as exc:
        raise ResultStoreError(f"cannot cancel bulk job {job_id}: {exc}") from exc
    return await load_job(client, names, job_id)
