"""100,000-row bulk jobs as real CLI processes: SIGKILLed halfway, resumed, exactly right.

And the reason bulk has its own lane: interactive requests submitted while a
bulk job saturates the fleet are served ahead of the bulk backlog.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchfleet.producers import AsyncClient
from batchfleet.producers.bulk import request_id_for
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from tests.e2e.test_bulk import TOL, _record, wait_for_rows
from tests.support.bulk_main import (
    BULK_COMMAND,
    mlp_inputs,
    mlp_reference,
    read_jsonl,
    write_jsonl,
)
from tests.support.fleet import running_worker
from tests.support.models import SlowMLP

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
N = 100_000
CHUNK = 512  # Tuning.chunk: at most one chunk can be published twice by a kill


async def _start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *BULK_COMMAND, "run", *args, "--progress", "log", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 240) -> dict[str, Any]:
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out)  # type: ignore[no-any-return]


async def _kill_halfway(args: list[str], redis_url: str, job_id: str) -> int:
    """Start the job, SIGKILL it once its checkpoint passes ~half; the rows it had saved."""
    proc = await _start(*args)
    try:
        await wait_for_rows(redis_url, job_id, N * 45 // 100, timeout=180)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    record = await _record(redis_url, job_id)
    assert record.display_status == "interrupted"  # its holder is dead: no need to wait
    return int(record.position.rows)


async def test_jsonl_job_killed_halfway_resumes_to_exactly_the_right_output(
        redis_url: str, tmp_path: Path) -> None:
    x = mlp_inputs(N, seed=10)
    write_jsonl(tmp_path / "in.jsonl", x)
    args = ["--model", "demo-mlp", "--input", str(tmp_path / "in.jsonl"),
            "--out", str(tmp_path / "out.jsonl"), "--job-id", "kill-jsonl",
            "--broker", redis_url]
    async with running_worker(redis_url, max_batch_size=256) as worker:
        saved = await _kill_halfway(args, redis_url, "kill-jsonl")
        report = await _finish(await _start(*args))
        stats = worker.stats
    assert N * 0.4 < saved < N and report["resumed_from"] == saved
    assert report["status"] == "finished" and report["rows"] == N and report["failed"] == 0
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert [r["row"] for r in rows] == list(range(N))  # every row once, in order
    assert [r["custom_id"] for r in rows] == [f"c{i}" for i in range(N)]
    np.testing.assert_allclose(np.array([r["outputs"] for r in rows], np.float32),
                               mlp_reference(x), **TOL)
    assert (tmp_path / "out.kill-jsonl.errors.jsonl").stat().st_size == 0
    # No duplicate work: rows finished before the kill were not run again. The only
    # possible repeat is a chunk published in the instant before the kill recorded it.
    assert stats.computed - N == stats.duplicates <= CHUNK


async def test_parquet_job_killed_halfway_resumes_from_its_last_part(
        redis_url: str, tmp_path: Path) -> None:
    x = mlp_inputs(N, seed=11)
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 10)
    pq.write_table(pa.table({"custom_id": [f"id-{i}" for i in range(N)], "inputs": column}),
                   tmp_path / "in.parquet", row_group_size=30_000)
    args = ["--model", "demo-mlp", "--input", str(tmp_path / "in.parquet"),
            "--out", str(tmp_path / "out.parquet"), "--job-id", "kill-parquet",
            "--part-rows", "10000", "--broker", redis_url]
    async with running_worker(redis_url, max_batch_size=256) as worker:
        saved = await _kill_halfway(args, redis_url, "kill-parquet")
        report = await _finish(await _start(*args))
        stats = worker.stats
    assert N * 0.4 < saved < N and report["resumed_from"] == saved
    assert report["rows"] == N and report["failed"] == 0
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("row").to_pylist() == list(range(N))
    assert table.column("custom_id").to_pylist() == [f"id-{i}" for i in range(N)]
    assert set(table.column("status").to_pylist()) == {"succeeded"}
    outputs = np.array(table.column("outputs").to_pylist(), np.float32)
    np.testing.assert_allclose(outputs, mlp_reference(x), **TOL)
    # rows computed after the last part but before the kill came back from the store
    assert stats.computed - N == stats.duplicates <= CHUNK


async def test_interactive_requests_are_served_while_a_bulk_job_saturates_the_fleet(
        redis_url: str, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", mlp_inputs(20_000, seed=12))
    handler = TorchModuleHandler("slow", SlowMLP(), input_spec=TensorSpec("float32", (10,)))
    async with running_worker(redis_url, handlers={"slow": handler}, max_batch_size=32), \
            AsyncClient(redis_url) as client:
        proc = await _start("--model", "slow", "--input", str(tmp_path / "in.jsonl"),
                            "--out", str(tmp_path / "out.jsonl"), "--job-id", "busy",
                            "--window", "6000", "--broker", redis_url)
        try:
            await wait_for_rows(redis_url, "busy", 1000, timeout=120)
            latencies = []
            for i in range(20):
                started = time.monotonic()
                rid = await client.submit("slow", np.full(10, i / 20, np.float32))
                result = await client.wait(rid, timeout=10)
                latencies.append(time.monotonic() - started)
                assert result.status == "succeeded"
            done = (await _record(redis_url, "busy")).position.rows
            sample = [request_id_for("busy", row) for row in range(done - 100, done)]
            bulk_queue_s = [r.queue_ms / 1000 for r in await client.wait_many(sample, 10)
                            if r.queue_ms is not None]
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    assert done < 20_000, "the bulk job must still be saturating the fleet"
    bulk_wait_s = statistics.median(bulk_queue_s)
    # bulk rows wait behind their whole window; interactive requests jump the queue
    seen = f"interactive {sorted(latencies)}, bulk queue median {bulk_wait_s:.2f}s"
    assert bulk_wait_s > 1.0, seen
    assert statistics.median(latencies) < bulk_wait_s / 5, seen
    assert max(latencies) < bulk_wait_s, seen
