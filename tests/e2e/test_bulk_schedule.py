"""The nightly schedule: the ``rq cron`` config in infra/ loads, and what it enqueues runs a job."""

from __future__ import annotations

import asyncio
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import redis
from rq.cron import CronScheduler

from tests.e2e.test_bulk import TOL, _record
from tests.support.bulk_main import mlp_inputs, mlp_reference, read_jsonl, write_jsonl
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "infra" / "cron" / "bulk_nightly.py"


async def test_rq_cron_config_schedules_a_bulk_job_that_an_rq_worker_runs(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = mlp_inputs(300, seed=20)
    write_jsonl(tmp_path / "in-2025-01-01.jsonl", x)
    for name, value in {
        "BATCHFLEET_BROKER": redis_url, "BATCHFLEET_BULK_MODEL": "demo-mlp",
        "BATCHFLEET_BULK_INPUT": str(tmp_path / "in-{date}.jsonl"),
        "BATCHFLEET_BULK_OUTPUT": str(tmp_path / "out-{date}.jsonl"),
        "BATCHFLEET_BULK_CRON": "30 1 * * *",
    }.items():
        monkeypatch.setenv(name, value)
    connection = redis.Redis.from_url(redis_url)
    scheduler = CronScheduler(connection=connection)
    scheduler.load_config_from_file(str(CONFIG))
    (cron_job,) = scheduler.get_jobs()
    assert cron_job.cron == "30 1 * * *" and cron_job.queue_name == "batchfleet-bulk"
    assert cron_job.func_name == "batchfleet.producers.bulk.scheduled.run_nightly"
    # what the scheduler enqueues at 01:30 (with the day pinned, as RQ's enqueue time would)
    cron_job.kwargs["day"] = date(2025, 1, 1)
    rq_job = cron_job.enqueue(connection)

    async with running_worker(redis_url):  # the fleet; `rq worker` runs the RQ job
        rq_worker = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "rq"), "worker", "batchfleet-bulk", "--burst",
            "--url", redis_url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        log, _ = await asyncio.wait_for(rq_worker.communicate(), 120)
        assert rq_worker.returncode == 0, log.decode()[-3000:]
    rq_job.refresh()
    assert rq_job.get_status() == "finished", rq_job.latest_result()
    report = rq_job.return_value()
    assert report["job_id"] == "nightly-20250101" and report["rows"] == 300
    rows = read_jsonl(tmp_path / "out-2025-01-01.jsonl")
    np.testing.assert_allclose(np.array([r["outputs"] for r in rows], np.float32),
                               mlp_reference(x), **TOL)
    record = await _record(redis_url, "nightly-20250101")
    assert record.status == "finished"
    connection.close()
