"""``bulk status JOB`` for a job split with ``--shard K/N``: the shards added up.

Each runner owns its record (``JOB.shardK-of-N``), so no runner ever writes
another's state and each resumes on its own; nothing writes a parent record.
Each runner notes its record in the job's shard index when it starts, so the
shards are found in one ``ZRANGE`` however many jobs exist; jobs started before
that index existed are found by searching the newest job IDs instead. A shard
that has not started yet is reported as such, not silently left out of the sum.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from batchfleet.connectors.control_plane import BulkJobStore
from batchfleet.producers.bulk.state import JobRecord, load_job

_SHARD_SUFFIX: Final = re.compile(r"^\.shard(\d+)-of-(\d+)$")
#: How many of the newest job IDs are searched for the shards of a job with no shard index.
SCAN_JOBS: Final = 10_000
#: The combined status: the first of these any shard has wins (finished only if all are).
_PRECEDENCE: Final = ("error", "interrupted", "running", "retrying", "cancelled",
                      "not started", "finished")


@dataclass(frozen=True, slots=True)
class ShardedJob:
    job_id: str
    shards: int
    #: Shard number -> its record, for the shards that have started.
    records: dict[int, JobRecord]

    @property
    def status(self) -> str:
        seen = {r.display_status for r in self.records.values()}
        if len(self.records) < self.shards:
            seen.add("not started")
        return next((s for s in _PRECEDENCE if s in seen), sorted(seen)[0])

    @property
    def total(self) -> int | None:
        totals = [r.total for r in self.records.values()]
        if len(totals) < self.shards or None in totals:
            return None
        return sum(t or 0 for t in totals)

    def to_dict(self) -> dict[str, Any]:
        records = list(self.records.values())
        first = records[0].identity if records else {}
        return {"job_id": self.job_id, "status": self.status, "shards": self.shards,
                "shards_started": len(self.records),
                "shards_finished": sum(r.status == "finished" for r in records),
                "model": first.get("model"), "input": first.get("input"),
                "output": first.get("output"), "errors": first.get("errors"),
                "parts_done": sum(r.dataset.parts for r in records),
                "parts": first.get("parts"),
                "rows_done": sum(r.rows_done for r in records), "total": self.total,
                "succeeded": sum(r.succeeded for r in records),
                "failed": sum(r.failed for r in records)}


async def load_sharded(store: BulkJobStore, job_id: str) -> ShardedJob | None:
    """The job's shard records, or None when it has none. When the job was split more
    than one way (say 1/2, later 1/3), the split of the most recently updated shard."""
    ids = await store.shards_of(job_id)
    if not ids:  # a job from before the shard index
        ids = [i for i in await store.recent(SCAN_JOBS) if i.startswith(job_id)]
    by_split: dict[int, dict[int, JobRecord]] = {}
    for record_id in ids:
        match = _SHARD_SUFFIX.match(record_id[len(job_id):])
        if match is None:
            continue
        record = await load_job(store, record_id)
        if record is not None:
            by_split.setdefault(int(match[2]), {})[int(match[1])] = record
    if not by_split:
        return None
    n = max(by_split, key=lambda k: max(r.updated_at for r in by_split[k].values()))
    return ShardedJob(job_id, n, dict(sorted(by_split[n].items())))
