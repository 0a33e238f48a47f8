"""Bulk jobs end to end with a real in-process worker: every format, bad rows, retries, control.

The job runs in-process here (``run_job``) or as the real CLI program; the
resume-after-SIGKILL and priority tests are in ``test_bulk_resume.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from batchfleet.connectors.bulk_jobs import RedisBulkJobs
from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers.bulk import (
    Endpoints,
    JobConflictError,
    JobSpec,
    Tuning,
    load_job,
    run_job,
)
from batchfleet.schemas.names import Names
from batchfleet.workers.models import TensorSpec, TorchModuleHandler, build_mlp
from tests.support.bulk_main import (
    BULK_COMMAND,
    mlp_inputs,
    mlp_reference,
    read_jsonl,
    write_jsonl,
)
from tests.support.fleet import running_worker
from tests.support.models import POISON, SlowMLP

pytestmark = pytest.mark.e2e
TOL = {"rtol": 1e-5, "atol": 1e-6}


async def _record(redis_url: str, job_id: str) -> Any:
    client = redis_client(redis_url)
    try:
        return await load_job(RedisBulkJobs(client, Names()), job_id)
    finally:
        await client.aclose()


async def wait_for_rows(redis_url: str, job_id: str, rows: int, timeout: float = 60) -> Any:
    """Until the job's durable checkpoint has reached ``rows``; its record."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        record = await _record(redis_url, job_id)
        if record is not None and record.position.rows >= rows:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach {rows} rows in {timeout}s")


def _hidden_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(".")]


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *BULK_COMMAND, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_malformed_rows_go_to_the_errors_file_with_line_numbers(
        redis_url: str, tmp_path: Path) -> None:
    n = 1000
    x = mlp_inputs(n, seed=1)
    bad = {10: ["{not json"], 20: ["", "   "], 30: ['["a", "list"]'],
           40: ['{"custom_id": "no-inputs"}'], 50: ['{"custom_id": "words", "inputs": ["a"]}'],
           60: ['{"custom_id": "ragged", "inputs": [[1, 2], [3]]}'],
           70: ['{"custom_id": "short", "inputs": [1, 2, 3]}']}
    write_jsonl(tmp_path / "in.jsonl", x, bad)
    spec = JobSpec.create("malformed-1", "demo-mlp", tmp_path / "in.jsonl",
                          tmp_path / "out.jsonl")
    async with running_worker(redis_url, max_batch_size=128):
        report = await run_job(spec, Endpoints(redis_url))
    out, errors = read_jsonl(spec.output), read_jsonl(spec.errors)
    assert report.status == "finished" and report.rows == n + 6 == len(out)
    assert [r["row"] for r in out] == list(range(n + 6))  # blank lines are not rows
    assert report.failed == 6 and report.succeeded == n
    by_id = {e["custom_id"]: e for e in errors}
    # each error names its input line (1-based; the blank lines count as lines)
    assert [e["line"] for e in errors] == [11, 34, 45, 56, 67, 78]
    assert errors[0]["error"]["type"] == "invalid_row" and "not valid JSON" in \
        errors[0]["error"]["message"]
    assert "expected a JSON object" in errors[1]["error"]["message"]
    assert "no 'inputs'" in by_id["no-inputs"]["error"]["message"]
    assert by_id["words"]["error"]["type"] == by_id["ragged"]["error"]["type"] == "invalid_row"
    # a well-formed row the worker refuses is failed by the worker, not here
    assert by_id["short"]["error"]["type"] == "validation_error"
    assert by_id["short"]["attempts"] >= 1
    good = [r for r in out if r["status"] == "succeeded"]
    assert [r["custom_id"] for r in good] == [f"c{i}" for i in range(n)]
    np.testing.assert_allclose(np.array([r["outputs"] for r in good], np.float32),
                               mlp_reference(x), **TOL)
    assert all(r["outputs"] is None for r in out if r["status"] == "failed")
    # the CLI on the finished job: its report, and the exit code judged by the failure rate
    common = ["run", "-m", "demo-mlp", "-i", str(tmp_path / "in.jsonl"), "--out",
              str(spec.output), "--job-id", "malformed-1", "--broker", redis_url]
    code, stdout, _ = await _cli(*common, "--json")
    assert code == 1 and json.loads(stdout)["failed"] == 6
    code, stdout, _ = await _cli(*common, "--max-failure-rate", "0.01")
    assert code == 0 and "failure rate" in stdout and "0.5964%" in stdout


def _parquet_tensor_column(path: Path, x: np.ndarray[Any, Any], row_group: int) -> None:
    values = pa.array(x.reshape(-1))
    column = pa.FixedSizeListArray.from_arrays(values, x.shape[1])
    ids = pa.array([f"id-{i}" for i in range(len(x))])
    pq.write_table(pa.table({"custom_id": ids, "inputs": column}), path,
                   row_group_size=row_group)


async def test_parquet_feature_columns_and_npy_inputs(redis_url: str, tmp_path: Path) -> None:
    n = 3000
    x = mlp_inputs(n, seed=2)
    features = {f"f{j}": x[:, j].astype(np.float64) for j in range(10)}  # float64 on disk
    features["f3"] = pa.array([None if i == 7 else float(v) for i, v in enumerate(x[:, 3])])
    pq.write_table(pa.table({"custom_id": np.arange(n) * 10, **features}),
                   tmp_path / "in.parquet", row_group_size=700)
    np.save(tmp_path / "in.npy", x)
    reference = mlp_reference(x)
    async with running_worker(redis_url, max_batch_size=128):
        pq_report = await run_job(JobSpec.create(
            "feat-1", "demo-mlp", tmp_path / "in.parquet", tmp_path / "out.parquet"),
            Endpoints(redis_url), tuning=Tuning(part_rows=1000))
        npy_report = await run_job(JobSpec.create(
            "npy-1", "demo-mlp", tmp_path / "in.npy", tmp_path / "scores.npy"),
            Endpoints(redis_url))
    table = pq.read_table(tmp_path / "out.parquet")
    assert pq_report.rows == n and pq_report.failed == 1  # the null feature
    assert table.column("row").to_pylist() == list(range(n))
    assert table.column("custom_id").to_pylist() == list(range(0, 10 * n, 10))
    assert table.schema.field("custom_id").type == pa.int64()
    statuses = table.column("status").to_pylist()
    assert statuses[7] == "failed" and statuses.count("succeeded") == n - 1
    outputs = table.column("outputs").to_pylist()
    assert outputs[7] is None
    keep = [i for i in range(n) if i != 7]
    np.testing.assert_allclose(np.array([outputs[i] for i in keep], np.float32),
                               reference[keep], **TOL)
    (error,) = read_jsonl(tmp_path / "out.feat-1.errors.jsonl")
    assert error["row"] == 7 and error["custom_id"] == 70 and "'f3' is null" in \
        error["error"]["message"]
    assert not _hidden_files(tmp_path)  # parts merged and removed
    # npy family: outputs array plus status array, row i for input row i
    assert npy_report.rows == n and npy_report.failed == 0
    np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), reference, **TOL)
    assert (np.load(tmp_path / "scores.status.npy") == 1).all()


class Fixable(nn.Module):
    """demo-mlp that fails poisoned rows until it is fixed (a bad deploy, then the fix)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()
        self.fixed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fixed and bool((x[:, 0] == POISON).any()):
            raise RuntimeError("poison input in batch")
        return self.inner(x)  # type: ignore[no-any-return]


async def test_retry_failed_resubmits_only_the_failed_rows(redis_url: str, tmp_path: Path
                                                           ) -> None:
    n = 400
    x = mlp_inputs(n, seed=3)
    poisoned = [5, 77, 150, 151, 399]
    x[poisoned, 0] = POISON
    write_jsonl(tmp_path / "in.jsonl", x, {200: ["{broken"]})
    module = Fixable()
    handler = TorchModuleHandler("fixable", module, input_spec=TensorSpec("float32", (10,)))
    spec = JobSpec.create("retry-1", "fixable", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    async with running_worker(redis_url, handlers={"fixable": handler}, max_attempts=1,
                              max_batch_size=64) as worker:
        first = await run_job(spec, Endpoints(redis_url))
        before = spec.output.read_bytes().splitlines()
        assert first.failed == 6 and first.rows == n + 1
        failed_rows = [e["row"] for e in read_jsonl(spec.errors)]
        # the broken line is row 200, so input 399 is row 400
        assert failed_rows == [5, 77, 150, 151, 200, 400]
        module.fixed = True
        computed = worker.stats.computed
        second = await run_job(spec, Endpoints(redis_url), retry_failed=True)
        recomputed = worker.stats.computed - computed
    assert second.status == "finished" and second.retry_round == 1
    assert second.rows_this_run == 6 and recomputed == 5  # the broken line is never sent
    assert second.failed == 1 and second.succeeded == n
    (still,) = read_jsonl(spec.errors)
    assert still["row"] == 200 and still["line"] == 201
    after = spec.output.read_bytes().splitlines()
    assert len(after) == len(before)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed == [5, 77, 150, 151, 400]  # untouched rows are byte-identical
    out = read_jsonl(spec.output)
    good = [r for r in out if r["status"] == "succeeded"]
    with torch.inference_mode():  # the fixed model, poisoned rows included
        expected = module.inner(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.array([r["outputs"] for r in good], np.float32), expected,
                               **TOL)
    record = await _record(redis_url, "retry-1")
    assert record.status == "finished" and record.retry_round == 1
    assert record.position.failed == 1


async def test_status_list_cancel_and_resume_after_cancel(redis_url: str, tmp_path: Path
                                                          ) -> None:
    n = 12_000
    x = mlp_inputs(n, seed=4)
    write_jsonl(tmp_path / "in.jsonl", x)
    spec = JobSpec.create("cancel-1", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    # 20 ms a batch of 32: the job runs for seconds, long enough to be looked at and cancelled
    slow = TorchModuleHandler("demo-mlp", SlowMLP(), input_spec=TensorSpec("float32", (10,)))
    async with running_worker(redis_url, handlers={"demo-mlp": slow}, max_batch_size=32):
        job = asyncio.create_task(run_job(spec, Endpoints(redis_url),
                                          tuning=Tuning(window=512, chunk=128)))
        await wait_for_rows(redis_url, "cancel-1", 1000)
        with pytest.raises(JobConflictError, match="already running"):
            await run_job(spec, Endpoints(redis_url))
        code, out, _ = await _cli("status", "cancel-1", "--broker", redis_url, "--json")
        status = json.loads(out)
        assert code == 0 and status["status"] == "running" and status["rows_done"] >= 1000
        assert status["total"] == n and status["model"] == "demo-mlp"
        code, out, _ = await _cli("list", "--broker", redis_url, "--json")
        assert code == 0 and [j["job_id"] for j in json.loads(out)] == ["cancel-1"]
        code, out, _ = await _cli("cancel", "cancel-1", "--broker", redis_url)
        assert code == 0 and "cancel requested" in out
        cancelled = await asyncio.wait_for(job, 30)
        assert cancelled.status == "cancelled" and 0 < cancelled.rows < n
        code, out, _ = await _cli("status", "cancel-1", "--broker", redis_url, "--json")
        assert json.loads(out)["status"] == "cancelled"
        assert len(read_jsonl(spec.output)) == cancelled.rows  # exactly the checkpoint
        resumed = await run_job(spec, Endpoints(redis_url))
    assert resumed.status == "finished" and resumed.resumed_from == cancelled.rows
    out_rows = read_jsonl(spec.output)
    assert [r["row"] for r in out_rows] == list(range(n))
    np.testing.assert_allclose(np.array([r["outputs"] for r in out_rows], np.float32),
                               mlp_reference(x), **TOL)
    code, _, err = await _cli("status", "nope", "--broker", redis_url)
    assert code == 4 and "no bulk job nope" in err


async def test_a_job_id_is_bound_to_its_input_and_a_finished_job_is_not_rerun(
        redis_url: str, tmp_path: Path) -> None:
    x = mlp_inputs(50, seed=5)
    write_jsonl(tmp_path / "a.jsonl", x)
    write_jsonl(tmp_path / "b.jsonl", x[:10])
    async with running_worker(redis_url) as worker:
        done = await run_job(JobSpec.create("bound-1", "demo-mlp", tmp_path / "a.jsonl",
                                            tmp_path / "a.out.jsonl"), Endpoints(redis_url))
        again = await run_job(JobSpec.create("bound-1", "demo-mlp", tmp_path / "a.jsonl",
                                             tmp_path / "a.out.jsonl"), Endpoints(redis_url))
        with pytest.raises(JobConflictError, match="different input"):
            await run_job(JobSpec.create("bound-1", "demo-mlp", tmp_path / "b.jsonl",
                                         tmp_path / "a.out.jsonl"), Endpoints(redis_url))
        computed = worker.stats.computed
    assert done.rows == again.rows == 50 and again.rows_this_run == 0 and computed == 50
