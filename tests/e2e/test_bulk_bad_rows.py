"""Bulk jobs that no row can kill, and that say what to do when they cannot go on.

A real worker (in-process) and the real CLI (a subprocess): a 65-tensor row and
a 150 MB line each fail alone while memory stays flat; a deleted output is
named with the way out (``--restart``); a Parquet file whose ``id`` column is
stacked into the features stops after its first rows with one clear line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from batchfleet.connectors.bulk_jobs import RedisBulkJobs
from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers import AsyncClient
from batchfleet.producers.bulk import Endpoints, JobSpec, Tuning, request_cancel, run_job
from batchfleet.producers.bulk.rows import Row
from batchfleet.producers.bulk.window import Scorer
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.names import Names
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from tests.e2e.test_bulk import TOL, _cli, _record, wait_for_rows
from tests.support.bulk_main import (
    BULK_COMMAND,
    mlp_inputs,
    mlp_reference,
    peak_rss_command,
    read_jsonl,
    write_jsonl,
)
from tests.support.fleet import running_worker
from tests.support.models import SlowMLP
from tests.support.seams import open_result_store

pytestmark = pytest.mark.e2e
MiB = 1024 * 1024


def _write_rows(f: IO[bytes], x: np.ndarray[Any, Any], first: int) -> None:
    for i, row in enumerate(x.tolist(), first):
        f.write(json.dumps({"custom_id": f"c{i}", "inputs": row}).encode() + b"\n")


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
async def test_a_65_tensor_row_and_a_150mb_line_fail_alone_and_memory_stays_flat(
        redis_url: str, tmp_path: Path) -> None:
    x = mlp_inputs(100, seed=20)
    huge_chunk = b"0.5," * (MiB // 4)
    with (tmp_path / "in.jsonl").open("wb") as f:  # the 150 MB line is streamed, never built
        _write_rows(f, x[:40], 0)
        f.write(json.dumps({"custom_id": "wide",
                            "inputs": {f"t{i}": [1.0] for i in range(65)}}).encode() + b"\n")
        _write_rows(f, x[40:70], 40)
        f.write(b'{"custom_id": "huge", "inputs": [')
        for _ in range(150):
            f.write(huge_chunk)
        f.write(b"0.5]}\n")
        _write_rows(f, x[70:], 70)
        f.write(json.dumps({"custom_id": "ints", "inputs": list(range(10))}).encode() + b"\n")
    huge_len = 150 * len(huge_chunk) + len(b'{"custom_id": "huge", "inputs": [0.5]}')
    out = tmp_path / "out.jsonl"
    args = ["run", "-m", "demo-mlp", "-i", str(tmp_path / "in.jsonl"), "--out", str(out),
            "--job-id", "no-row-kills", "--broker", redis_url, "--progress", "none",
            "--json", "--max-failure-rate", "0.05"]
    rss_file = tmp_path / "peak_rss"
    async with running_worker(redis_url, max_batch_size=64):
        proc = await asyncio.create_subprocess_exec(
            *peak_rss_command(rss_file, [*BULK_COMMAND, *args]),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out_bytes, err_bytes = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err_bytes.decode()[-3000:]
    peak_rss = int(rss_file.read_text())
    report = json.loads(out_bytes)
    assert report["status"] == "finished" and report["rows"] == 103
    assert report["succeeded"] == 100 and report["failed"] == 3
    errors = read_jsonl(out.with_name("out.no-row-kills.errors.jsonl"))
    assert [(e["custom_id"], e["row"], e["line"], e["error"]["type"]) for e in errors] == [
        ("wide", 40, 41, "invalid_row"), (None, 71, 72, "invalid_row"),
        ("ints", 102, 103, "validation_error")]
    assert "65 named tensors" in errors[0]["error"]["message"]
    assert errors[1]["error"]["message"] == (
        f"line 72 is {huge_len:,} bytes, over the 16,777,216-byte limit (--max-line-bytes)")
    assert "run with --dtype float32" in errors[2]["error"]["message"]
    rows = read_jsonl(out)
    good = [r for r in rows if r["status"] == "succeeded"]
    assert [r["custom_id"] for r in good] == [f"c{i}" for i in range(100)]
    np.testing.assert_allclose(np.array([r["outputs"] for r in good], np.float32),
                               mlp_reference(x), **TOL)
    assert peak_rss < 200 * MiB, f"bulk job peak RSS {peak_rss / MiB:.0f} MiB"


async def test_a_finished_job_whose_output_was_deleted_says_so_and_restarts(
        redis_url: str, tmp_path: Path) -> None:
    x = mlp_inputs(50, seed=21)
    with (tmp_path / "in.jsonl").open("wb") as f:
        _write_rows(f, x, 0)
    spec = JobSpec.create("gone-1", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    args = ["run", "-m", "demo-mlp", "-i", str(spec.input), "--out", str(spec.output),
            "--job-id", "gone-1", "--broker", redis_url, "--progress", "none", "--json"]
    async with running_worker(redis_url) as worker:
        assert (await run_job(spec, Endpoints(redis_url))).rows == 50
        spec.output.unlink()
        code, _, err = await _cli(*args)
        assert code == 2
        assert _error_lines(err) == [
            f"error: output {spec.output} is missing but the job state says 50 rows are "
            f"done: run again with --restart to score from scratch, or restore {spec.output}"]
        computed = worker.stats.computed
        code, out, err = await _cli(*args, "--restart")
        recomputed = worker.stats.computed - computed
    assert code == 0, err[-2000:]
    assert json.loads(out)["rows_this_run"] == 50 and recomputed == 50  # new request IDs
    rows = read_jsonl(spec.output)
    assert [r["row"] for r in rows] == list(range(50))
    np.testing.assert_allclose(np.array([r["outputs"] for r in rows], np.float32),
                               mlp_reference(x), **TOL)
    record = await _record(redis_url, "gone-1")
    assert record.status == "finished" and record.epoch == 1


async def test_a_half_done_job_whose_output_was_deleted_gives_one_coherent_message(
        redis_url: str, tmp_path: Path) -> None:
    n = 6000
    with (tmp_path / "in.jsonl").open("wb") as f:
        _write_rows(f, mlp_inputs(n, seed=22), 0)
    spec = JobSpec.create("half-1", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    slow = TorchModuleHandler("demo-mlp", SlowMLP(), input_spec=TensorSpec("float32", (10,)))
    async with running_worker(redis_url, handlers={"demo-mlp": slow}, max_batch_size=32):
        job = asyncio.create_task(run_job(spec, Endpoints(redis_url),
                                          tuning=Tuning(window=256, chunk=128)))
        await wait_for_rows(redis_url, "half-1", 300)
        client = redis_client(redis_url)
        try:
            await request_cancel(RedisBulkJobs(client, Names()), "half-1")
        finally:
            await client.aclose()
        cancelled = await asyncio.wait_for(job, 30)
    assert cancelled.status == "cancelled" and 0 < cancelled.rows < n
    spec.output.unlink()
    code, _, err = await _cli("run", "-m", "demo-mlp", "-i", str(spec.input), "--out",
                              str(spec.output), "--job-id", "half-1", "--broker", redis_url)
    assert code == 2
    assert _error_lines(err) == [
        f"error: output {spec.output} is missing but the job state says {cancelled.rows:,} "
        f"rows are done: run again with --restart to score from scratch, or restore "
        f"{spec.output}"]
    assert (await _record(redis_url, "half-1")).position.rows == cancelled.rows  # untouched


async def test_a_parquet_id_column_in_the_features_warns_and_stops_early(
        redis_url: str, tmp_path: Path) -> None:
    n = 2000
    x = mlp_inputs(n, seed=23)
    pq.write_table(pa.table({"id": np.arange(n), **{f"f{j}": x[:, j] for j in range(10)}}),
                   tmp_path / "in.parquet", row_group_size=500)
    args = ["run", "-m", "demo-mlp", "-i", str(tmp_path / "in.parquet"), "--out",
            str(tmp_path / "out.parquet"), "--job-id", "id-trap", "--broker", redis_url,
            "--progress", "none", "--log-format", "json"]
    async with running_worker(redis_url, max_batch_size=128):
        code, _, err = await _cli(*args)
        assert code == 1
        warnings = [json.loads(line) for line in err.splitlines() if line.startswith("{")
                    and json.loads(line)["event"] == "bulk input looks wrong"]
        assert [w["warning"] for w in warnings] == [
            "column 'id' looks like a row ID but is stacked into the features: pass "
            "--id-column id (or list the features with --feature-columns)"]
        assert _error_lines(err) == [
            "error: stopped early: the first 100 rows all failed the same way "
            "(validation_error: wrong shape: expected float32[10], got float32[11]); "
            f"{warnings[0]['warning']}. Fix the input or options, then run again with "
            "--restart (or --early-stop-rows 0 to score every row anyway)"]
        record = await _record(redis_url, "id-trap")
        assert record.status == "error" and record.position.rows < n
        code, _, err = await _cli(*args, "--id-column", "id")  # the fix changes the job
        assert code == 4 and "different id_column" in err
        code, out, err = await _cli(*args, "--id-column", "id", "--restart", "--json")
    assert code == 0, err[-2000:]
    assert json.loads(out)["failed"] == 0
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == list(range(n))
    np.testing.assert_allclose(np.array(table.column("outputs").to_pylist(), np.float32),
                               mlp_reference(x), **TOL)


async def test_a_row_the_envelope_refuses_at_submit_fails_alone(redis_url: str) -> None:
    """The last line of defence: a row that got past the source's checks (built by hand
    here) is refused by the envelope at submit; only that row fails, the chunk goes on."""
    x = mlp_inputs(6, seed=24)
    rows = [Row(i, x[i]) for i in range(6)]
    rows[2] = Row(2, {f"t{i}": x[0] for i in range(65)})  # 65 named tensors
    written: list[tuple[int, Result]] = []

    async def tick() -> bool:
        return True

    async with running_worker(redis_url), AsyncClient(redis_url) as client:
        store = open_result_store(redis_url, Names())
        try:
            scorer = Scorer(client, store, "demo-mlp", lambda row: f"refused:{row}", Tuning())
            assert await scorer.run(rows, lambda row, result: written.append((row.index, result)),
                                    tick)
        finally:
            await store.close()
    assert [i for i, _ in written] == list(range(6))
    assert [r.status for _, r in written] == ["succeeded"] * 2 + ["failed"] + ["succeeded"] * 3
    error = written[2][1].error
    assert error is not None and error.type == "invalid_row"
    assert error.message.startswith("inputs refused: ") and "64 named tensors" in error.message


async def test_most_of_the_first_rows_failing_stops_early_with_the_rate_and_the_fix(
        redis_url: str, tmp_path: Path) -> None:
    """Two rows in three are whole numbers (int64) for a float32 model: not all the same
    failure, but over ``--early-stop-rate`` (default 0.5), so the job stops after its
    first 100 rows with the rate, the most common error and its ``--dtype`` hint."""
    n = 300
    x = mlp_inputs(n, seed=25)
    with (tmp_path / "in.jsonl").open("wb") as f:
        for i, row in enumerate(x.tolist()):
            inputs = [round(v * 10) for v in row] if i % 3 else row
            f.write(json.dumps({"custom_id": f"c{i}", "inputs": inputs}).encode() + b"\n")
    args = ["run", "-m", "demo-mlp", "-i", str(tmp_path / "in.jsonl"), "--out",
            str(tmp_path / "out.jsonl"), "--job-id", "rate-trap", "--broker", redis_url,
            "--progress", "none"]
    async with running_worker(redis_url, max_batch_size=64):
        code, _, err = await _cli(*args)
        assert code == 1
        [line] = _error_lines(err)  # the hint's wording is the worker's, so not pinned
        assert line.startswith(
            "error: stopped early: 66 of the first 100 rows failed (66%, over "
            "--early-stop-rate 0.5); most common (66): validation_error: wrong dtype: "
            "expected float32, got int64 (")
        assert "--dtype float32" in line
        assert line.endswith(". Fix the input or options, then run again with --restart "
                             "(or --early-stop-rate 1 to score every row anyway)")
        record = await _record(redis_url, "rate-trap")
        assert record.status == "error" and record.position.rows == 0  # no checkpoint
        code, out, err = await _cli(*args, "--early-stop-rate", "1", "--json",
                                    "--max-failure-rate", "1")
    assert code == 0, err[-2000:]
    assert json.loads(out)["failed"] == 200  # overridden: every row scored


class _LogOfFirst(torch.nn.Module):
    """log of each row's first feature: NaN for a negative one (finite in, NaN out)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x[:, :1])


async def test_nan_and_infinite_rows_are_bad_rows_and_the_output_is_strict_json(
        redis_url: str, tmp_path: Path) -> None:
    """NaN / Infinity inputs fail alone as ``invalid_row`` (never submitted, like the
    gateway's 422); a NaN the model makes is written as null, so every line is strict JSON."""
    x = np.abs(mlp_inputs(40, seed=25)) + 0.5
    x[7, 0] = -1.0  # finite in, NaN out
    write_jsonl(tmp_path / "in.jsonl", x, {
        10: ['{"custom_id": "nan", "inputs": [NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1]}'],
        20: ['{"custom_id": "inf", "inputs": {"x": [Infinity, 1, 1, 1, 1, 1, 1, 1, 1, 1]}}']})
    handler = TorchModuleHandler("logs", _LogOfFirst(), input_spec=TensorSpec("float32", (10,)))
    spec = JobSpec.create("nan-1", "logs", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    async with running_worker(redis_url, handlers={"logs": handler}):
        report = await run_job(spec, Endpoints(redis_url))

    def strict(line: str) -> Any:
        return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in {line}"))

    out = [strict(line) for line in spec.output.read_text().splitlines()]
    errors = [strict(line) for line in spec.errors.read_text().splitlines()]
    assert report.status == "finished" and (report.succeeded, report.failed) == (40, 2)
    assert [(e["custom_id"], e["error"]["type"]) for e in errors] == \
        [("nan", "invalid_row"), ("inf", "invalid_row")]
    assert all("numbers must be finite" in e["error"]["message"] for e in errors)
    good = {r["custom_id"]: r["outputs"] for r in out if r["status"] == "succeeded"}
    assert len(good) == 40 and good["c7"] == [None]
    assert sum(v == [None] for v in good.values()) == 1
