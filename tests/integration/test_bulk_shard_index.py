"""``bulk status JOB`` finds a split job's shards through its shard index, not the job list."""

from __future__ import annotations

import json
import uuid

import pytest

from batchfleet.connectors.bulk_jobs import open_bulk_jobs
from batchfleet.producers.bulk.shards import load_sharded
from batchfleet.producers.bulk.state import JOB_TTL_S
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.integration


async def test_shards_older_than_the_searched_job_ids_are_still_added_up(redis_url: str
                                                                       ) -> None:
    names = Names(f"t{uuid.uuid4().hex[:8]}")
    store = open_bulk_jobs(redis_url, names)
    try:
        shard_ids = ["nightly.shard1-of-2", "nightly.shard2-of-2"]
        for i, record_id in enumerate(shard_ids):
            await store.create(record_id, {
                "identity": json.dumps({"model": "demo-mlp", "parts": 4}),
                "status": "finished", "rows_done": 10 * (i + 1), "created_at": 1.0,
                "updated_at": 2.0 + i}, 1.0 + i)
        # Pushed out of the newest job IDs (as 10,000 later jobs would): only the index finds them.
        await store.unindex(shard_ids)
        assert await load_sharded(store, "nightly") is None
        for i, record_id in enumerate(shard_ids):
            await store.index_shard("nightly", record_id, 1.0 + i, JOB_TTL_S)
        await store.index_shard("nightly", shard_ids[0], 9.0, JOB_TTL_S)  # a resume: no-op
        assert await store.shards_of("nightly") == shard_ids
        job = await load_sharded(store, "nightly")
        assert job is not None and job.shards == 2 and sorted(job.records) == [1, 2]
        assert job.status == "finished"
        ttl = await store._redis.ttl(names.bulk_shards("nightly"))
        assert 0 < ttl <= JOB_TTL_S
    finally:
        await store.close()
