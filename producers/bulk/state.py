"""A bulk job's durable state: identity, checkpoint, status, lease and cancel flag.

One hash per job holds everything ``bulk status`` shows and everything a resume
needs (the :class:`Position` checkpoint, and ``published``: every row below it
was put on the broker, so a resume waits for those instead of publishing them
again). An index lists the jobs for ``bulk list``. The storage itself is a
``BulkJobStore`` (``connectors.bulk_jobs``); this module says what the fields mean.

Only the holder of the job's *lease* (a key with a TTL, refreshed while the job
runs) may write: every write is one fenced call that checks the lease first, so a
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
from typing import Any, Final, Protocol

from batchfleet.connectors.control_plane import BulkJobStore
from batchfleet.producers.bulk.errors import JobConflictError, LeaseLostError
from batchfleet.producers.bulk.rows import Position
from batchfleet.schemas.errors import ResultStoreError

LEASE_TTL_S: Final = 15
#: Job records outlive their results (24 h) so a finished job can still be listed and retried.
JOB_TTL_S: Final = 30 * 24 * 3600
ACTIVE: Final = frozenset({"running", "retrying"})


class Identified(Protocol):
    """What claiming a job needs of its spec (a file's ``JobSpec`` or a ``DatasetSpec``)."""

    def identity(self) -> dict[str, Any]: ...

    def resuming(self, stored: dict[str, Any]) -> Any: ...


@dataclass(frozen=True, slots=True)
class DatasetProgress:
    """A dataset runner's finished parts; its ``Position`` is within the current part.

    ``phase`` is ``publish`` between "the part's files are complete in staging"
    and "they are at their final names", so a run killed in between publishes
    again (publishing is idempotent) instead of scoring the part again.
    """

    parts: int = 0
    rows: int = 0
    succeeded: int = 0
    failed: int = 0
    phase: str = ""

    def to_fields(self) -> dict[str, Any]:
        return {"ds_parts": self.parts, "ds_rows": self.rows, "ds_succeeded": self.succeeded,
                "ds_failed": self.failed, "ds_phase": self.phase}

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> DatasetProgress:
        def number(key: str) -> int:
            return int(f.get(key) or 0)

        return cls(number("ds_parts"), number("ds_rows"), number("ds_succeeded"),
                   number("ds_failed"), f.get("ds_phase", ""))


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    status: str
    identity: dict[str, Any]
    position: Position
    total: int | None
    published: int
    retry_round: int
    #: Bumped by ``--restart``: part of every request ID, so a restart computes rows anew.
    epoch: int
    created_at: float
    updated_at: float
    finished_at: float | None
    error: str
    cancel_requested: bool
    owner: str | None
    #: Parts finished by a dataset runner (all zero for a single file).
    dataset: DatasetProgress = DatasetProgress()

    @property
    def rows_done(self) -> int:
        return self.dataset.rows + self.position.rows

    @property
    def succeeded(self) -> int:
        return self.dataset.succeeded + self.position.succeeded

    @property
    def failed(self) -> int:
        return self.dataset.failed + self.position.failed

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
            epoch=int(f.get("epoch") or 0),
            created_at=float(f.get("created_at") or 0), updated_at=float(f.get("updated_at") or 0),
            finished_at=float(f["finished_at"]) if f.get("finished_at") else None,
            error=f.get("error", ""), cancel_requested=f.get("cancel") == "1",
            owner=_text(owner) if owner else None, dataset=DatasetProgress.from_fields(f))


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
    def __init__(self, store: BulkJobStore, job_id: str) -> None:
        self._store, self.job_id = store, job_id
        self.token = f"{socket.gethostname()}|{os.getpid()}|{uuid.uuid4().hex[:8]}"

    async def claim(self, spec: Identified, total: int | None, restart: bool = False
                    ) -> JobRecord:
        """Take the job's lease and create or load its record; refuse a mismatched spec.

        ``restart`` starts an existing job over instead: a new epoch (so new request
        IDs), position 0, and this spec as its identity.
        """
        holder = await self._store.take_lease(self.job_id, self.token, LEASE_TTL_S)
        if holder is not None and not (holder and _holder_is_dead_here(holder) and (
                await self._store.steal_lease(self.job_id, holder, self.token, LEASE_TTL_S))):
            raise JobConflictError(f"job {self.job_id} is already running ({holder}); "
                                   "cancel it or wait for it")
        raw = await self._store.fields(self.job_id)
        created = not raw
        if created:
            now = time.time()
            await self._store.create(self.job_id, {
                "identity": json.dumps(spec.identity()), "status": "running",
                "created_at": now, "updated_at": now, "total": total or ""}, now)
            raw = await self._store.fields(self.job_id)
        record = JobRecord.parse(self.job_id, raw, self.token)
        if restart and not created:
            try:
                return await self._restart(spec, record, total)
            except BaseException:
                await self.release()
                raise
        spec = spec.resuming(record.identity)
        if record.identity != spec.identity():
            await self.release()
            diff = sorted(k for k, v in spec.identity().items() if record.identity.get(k) != v)
            raise JobConflictError(f"job {self.job_id} was started with a different "
                                   f"{', '.join(diff)}; use a new job ID")
        return record

    async def _restart(self, spec: Identified, record: JobRecord, total: int | None
                       ) -> JobRecord:
        await self.write(**Position().to_fields(), **DatasetProgress().to_fields(),
                         identity=json.dumps(spec.identity()),
                         status="running", published=0, round=0, epoch=record.epoch + 1,
                         error="", cancel=0, total=total or "", finished_at=None)
        return JobRecord.parse(self.job_id, await self._store.fields(self.job_id), self.token)

    async def write(self, **fields: Any) -> bool:
        """Fenced write (plus ``updated_at``); returns whether a cancel was requested."""
        cancel = await self._store.fenced_write(
            self.job_id, self.token, {**fields, "updated_at": time.time()},
            LEASE_TTL_S, JOB_TTL_S)
        if cancel < 0:
            raise LeaseLostError(f"job {self.job_id} was taken over by another process")
        return bool(cancel)

    async def checkpoint(self, pos: Position, **fields: Any) -> bool:
        return await self.write(**pos.to_fields(), **fields)

    async def release(self) -> None:
        with contextlib.suppress(ResultStoreError):  # else it expires within LEASE_TTL_S
            await self._store.release_lease(self.job_id, self.token)


async def load_job(store: BulkJobStore, job_id: str) -> JobRecord | None:
    raw, owner = await store.read(job_id)
    return JobRecord.parse(job_id, raw, owner) if raw else None


async def list_jobs(store: BulkJobStore, limit: int = 50) -> list[JobRecord]:
    """Newest first; index entries whose record expired are dropped on the way."""
    ids = await store.recent(limit)
    records = [await load_job(store, job_id) for job_id in ids]
    await store.unindex([job_id for job_id, r in zip(ids, records, strict=True) if r is None])
    return [r for r in records if r is not None]


async def request_cancel(store: BulkJobStore, job_id: str) -> JobRecord | None:
    """Flag the job; a live run stops at its next checkpoint. A dead one is marked at once."""
    record = await load_job(store, job_id)
    if record is None:
        return None
    fields: dict[str, Any] = {"cancel": 1, "updated_at": time.time()}
    if record.status in ACTIVE and not record.live:
        fields.update(status="cancelled", finished_at=time.time())
    await store.write(job_id, fields)
    return await load_job(store, job_id)
