"""Bulk datasets: Parquet parts on S3 (a real moto server), split across two runners, one of
them SIGKILLed and resumed; JSONL parts from a local glob and directory; bad locations.

The runners are the real CLI (``batchfleet bulk run --shard K/N``) in subprocesses, so
the kill is a real SIGKILL and S3 is reached through ``AWS_ENDPOINT_URL`` as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from batchfleet.connectors.bulk_jobs import RedisBulkJobs
from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers.bulk import Endpoints, JobSpec, Tuning, load_job, run_job
from batchfleet.producers.bulk.dataset import DatasetSpec
from batchfleet.producers.bulk.dataset_job import open_part, run_dataset
from batchfleet.producers.bulk.rows import Position
from batchfleet.producers.bulk.storage import S3Options
from batchfleet.schemas.names import Names
from batchfleet.workers.models import TensorSpec, TorchModuleHandler, build_mlp
from tests.support import s3 as s3_support
from tests.support.bulk_main import (
    BULK_COMMAND,
    mlp_inputs,
    mlp_reference,
    read_jsonl,
    write_jsonl,
)
from tests.support.fleet import running_worker
from tests.support.models import SlowMLP
from tests.support.s3 import S3Server

pytestmark = pytest.mark.e2e
s3_server = s3_support.s3_server  # the fixtures, registered here by name
moto_s3 = s3_support.moto_s3
TOL = {"rtol": 1e-5, "atol": 1e-6}
PART_ROWS = 2000
N_PARTS = 4


def _handlers() -> dict[str, Any]:
    """``slow`` (20 ms a batch: a runner can be killed mid-part) and ``demo-mlp``; both
    compute demo-mlp's outputs."""
    spec = TensorSpec("float32", (10,))
    return {"slow": TorchModuleHandler("slow", SlowMLP(), input_spec=spec),
            "demo-mlp": TorchModuleHandler("demo-mlp", build_mlp(), input_spec=spec)}


def _part_table(index: int) -> tuple[Any, np.ndarray[Any, Any]]:
    x = mlp_inputs(PART_ROWS, seed=100 + index)
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 10)
    ids = [f"p{index}-{i}" for i in range(PART_ROWS)]
    return pa.table({"custom_id": ids, "inputs": column}), x


async def _shard_index(redis_url: str, job_id: str) -> list[str]:
    client = redis_client(redis_url)
    try:
        return await RedisBulkJobs(client, Names()).shards_of(job_id)
    finally:
        await client.aclose()


async def _record(redis_url: str, job_id: str) -> Any:
    client = redis_client(redis_url)
    try:
        return await load_job(RedisBulkJobs(client, Names()), job_id)
    finally:
        await client.aclose()


async def _start(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *BULK_COMMAND, "run", *args, "--progress", "none", "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _finish(proc: asyncio.subprocess.Process, timeout: float = 120) -> dict[str, Any]:
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out)  # type: ignore[no-any-return]


async def _wait_rows(redis_url: str, job_id: str, rows: int, timeout: float = 60) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        record = await _record(redis_url, job_id)
        if record is not None and record.rows_done >= rows:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} did not reach {rows} rows in {timeout}s")


def _visible_parts_are_complete(fs: Any, prefix: str, rows: int) -> list[str]:
    """Every output part a reader can see is whole (a valid Parquet file with all its rows)."""
    names = []
    for info in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)):
        if info.type == pafs.FileType.File and info.path.endswith(".parquet") \
                and "/_" not in info.path:
            assert pq.read_metadata(info.path, filesystem=fs).num_rows == rows, info.path
            names.append(info.path.rsplit("/", 1)[1])
    return sorted(names)


def _same_as_reference(got: Any, ref: Any, x: np.ndarray[Any, Any]) -> None:
    """An S3 output part against the same part scored as a single local file."""
    assert got.schema == ref.schema
    for column in ("custom_id", "row", "status"):
        assert got.column(column).to_pylist() == ref.column(column).to_pylist()
    assert got.column("row").to_pylist() == list(range(PART_ROWS))  # in order
    out = np.array(got.column("outputs").to_pylist(), np.float32)
    np.testing.assert_allclose(out, np.array(ref.column("outputs").to_pylist()), **TOL)
    np.testing.assert_allclose(out, mlp_reference(x), **TOL)


async def _status(redis_url: str, job_id: str) -> tuple[dict[str, Any], str]:
    """``bulk status JOB`` as JSON, and as the table a person reads."""
    printed = []
    for fmt in ("json", "table"):
        proc = await asyncio.create_subprocess_exec(
            *BULK_COMMAND, "status", job_id, "--broker", redis_url, "-o", fmt,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        printed.append(out.decode())
    return json.loads(printed[0]), printed[1]


async def test_sharded_s3_parquet_dataset_killed_and_resumed_matches_the_local_run(
        redis_url: str, moto_s3: S3Server, tmp_path: Path) -> None:
    fs = moto_s3.filesystem()
    fs.create_dir("data")
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    inputs = []
    for i in range(N_PARTS):
        table, x = _part_table(i)
        pq.write_table(table, f"data/in/part-{i}.parquet", filesystem=fs)
        pq.write_table(table, local_dir / f"part-{i}.parquet")
        inputs.append(x)
    fs.create_dir("data/in/_logs")  # not a part: skipped, as dataset readers skip it
    common = ["--model", "slow", "--input", "s3://data/in", "--out", "s3://data/out",
              "--job-id", "nightly", "--part-rows", "250", "--broker", redis_url,
              "--staging-dir", str(tmp_path / "staging")]
    env = moto_s3.env()
    async with running_worker(redis_url, handlers=_handlers(), max_batch_size=32) as worker:
        first = await _start(env, *common, "--shard", "1/2")
        second = await _start(env, *common, "--shard", "2/2")
        try:
            # shard 1 owns parts 0 and 2: kill it once part 0 is out and part 2 is under way
            await _wait_rows(redis_url, "nightly.shard1-of-2", PART_ROWS + 300)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        killed = await _record(redis_url, "nightly.shard1-of-2")
        assert killed.display_status == "interrupted"
        assert killed.dataset.parts == 1 and killed.rows_done < 2 * PART_ROWS
        assert "part-2.parquet" not in _visible_parts_are_complete(fs, "data/out", PART_ROWS)
        resumed = await _finish(await _start(env, *common, "--shard", "1/2"))
        other = await _finish(second)
        # the reference: each part as a single local file, the path that existed before
        for i in range(N_PARTS):
            spec = JobSpec.create(f"local-{i}", "demo-mlp", local_dir / f"part-{i}.parquet",
                                  tmp_path / f"ref-{i}.parquet")
            await run_job(spec, Endpoints(redis_url), tuning=Tuning(part_rows=500))
        stats = worker.stats
    assert resumed["resumed_from"] == killed.rows_done > PART_ROWS
    assert resumed["rows"] == other["rows"] == 2 * PART_ROWS
    assert resumed["failed"] == other["failed"] == 0
    # one complete output part per input part, and nothing else visible
    assert _visible_parts_are_complete(fs, "data/out", PART_ROWS) == [
        f"part-{i}.parquet" for i in range(N_PARTS)]
    assert [i.path for i in fs.get_file_info(pafs.FileSelector("data/out"))] == [
        "data/out/part-0.parquet", "data/out/part-1.parquet", "data/out/part-2.parquet",
        "data/out/part-3.parquet"]  # no temporary uploads left, and no errors
    for i in range(N_PARTS):
        _same_as_reference(pq.read_table(f"data/out/part-{i}.parquet", filesystem=fs),
                           pq.read_table(tmp_path / f"ref-{i}.parquet"), inputs[i])
    # the kill cost at most the rows in flight, not the finished part
    assert stats.computed - 2 * N_PARTS * PART_ROWS == stats.duplicates <= 512
    status, table = await _status(redis_url, "nightly")  # the shards added up
    assert "shard 1/2" in table and "shard 2/2" in table and "8,000 / 8,000" in table
    assert status["status"] == "finished" and status["shards"] == 2
    assert status["rows_done"] == status["total"] == N_PARTS * PART_ROWS
    assert status["parts_done"] == status["parts"] == N_PARTS
    assert sorted(await _shard_index(redis_url, "nightly")) == [  # found without a search
        "nightly.shard1-of-2", "nightly.shard2-of-2"]


async def test_local_jsonl_parts_from_a_glob_and_a_directory(
        redis_url: str, tmp_path: Path) -> None:
    src = tmp_path / "in"
    (src / "b").mkdir(parents=True)
    sizes = {"a.jsonl": 300, "b/c.jsonl": 200, "d.jsonl": 250}
    inputs = {}
    for name, n in sizes.items():
        inputs[name] = mlp_inputs(n, seed=len(name) + n)
        write_jsonl(src / name, inputs[name], extra={5: ['{"no": "inputs"}']})
    (src / "_SUCCESS").write_text("")
    (src / "notes.txt").write_text("not a part")
    async with running_worker(redis_url, max_batch_size=64):
        glob = await asyncio.create_subprocess_exec(
            *BULK_COMMAND, "run", "--model", "demo-mlp", "--input", str(src / "*.jsonl"),
            "--out", str(tmp_path / "by-glob"), "--job-id", "glob", "--broker", redis_url,
            "--progress", "none", "--json", "--max-failure-rate", "0.01",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        by_glob = await _finish(glob)
        spec = DatasetSpec.create("dir", "demo-mlp", str(src), str(tmp_path / "by-dir"),
                                  s3=S3Options())
        by_dir = await run_dataset(spec, Endpoints(redis_url))
    assert by_glob["rows"] == 300 + 250 + 2 and by_glob["failed"] == 2  # b/ is not globbed
    assert by_dir.rows == sum(sizes.values()) + 3 and by_dir.failed == 3
    assert sorted(p.name for p in (tmp_path / "by-glob").iterdir()) == [
        "_errors", "a.jsonl", "d.jsonl"]
    for name, n in sizes.items():
        rows = read_jsonl(tmp_path / "by-dir" / name)
        assert [r["row"] for r in rows] == list(range(n + 1))
        good = [r for r in rows if r["status"] == "succeeded"]
        assert [r["custom_id"] for r in good] == [f"c{i}" for i in range(n)]
        np.testing.assert_allclose(np.array([r["outputs"] for r in good], np.float32),
                                   mlp_reference(inputs[name]), **TOL)
        errors = read_jsonl(tmp_path / "by-dir" / "_errors" / f"{name}.errors.jsonl")
        assert [(e["row"], e["line"], e["error"]["type"]) for e in errors] == [
            (5, 6, "invalid_row")]
        if name != "b/c.jsonl":
            assert (tmp_path / "by-glob" / name).read_bytes() == \
                (tmp_path / "by-dir" / name).read_bytes()
    assert not list((tmp_path / "by-dir").glob(".*"))  # staging cleaned up


@pytest.mark.parametrize(("input", "message"), [
    ("s3://no-such-bucket/in", "error: cannot list s3://no-such-bucket/in: bucket "
                               "'no-such-bucket' does not exist"),
    ("s3://data/nothing-here", "error: no Parquet or JSONL parts found in "
                               "s3://data/nothing-here"),
    ("s3://data/in/*.csv", "error: no Parquet or JSONL parts found in s3://data/in matching "
                           "'*.csv' (1 other file; parts end in .parquet, .pq, .jsonl or "
                           ".ndjson)"),
])
async def test_a_bad_s3_location_is_one_clear_line(
        moto_s3: S3Server, input: str, message: str) -> None:
    fs = moto_s3.filesystem()
    fs.create_dir("data")
    with fs.open_output_stream("data/in/x.csv") as f:
        f.write(b"a,b\n")
    proc = await asyncio.create_subprocess_exec(
        *BULK_COMMAND, "run", "--model", "demo-mlp", "--input", input, "--out",
        "s3://data/out", "--broker", "redis://127.0.0.1:1/0", env=moto_s3.env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, err.decode()
    assert lines == [message], lines


async def test_jsonl_parts_on_s3_scored_into_a_local_directory(
        redis_url: str, moto_s3: S3Server, tmp_path: Path) -> None:
    fs = moto_s3.filesystem()
    fs.create_dir("rows")
    inputs = {name: mlp_inputs(n, seed=n) for name, n in (("a.jsonl", 150), ("b.jsonl", 90))}
    for name, x in inputs.items():
        write_jsonl(tmp_path / name, x)
        with fs.open_output_stream(f"rows/day=1/{name}") as f:
            f.write((tmp_path / name).read_bytes())
    spec = DatasetSpec.create("remote-jsonl", "demo-mlp", "s3://rows/day=*/*.jsonl",
                              str(tmp_path / "out"), s3=S3Options.from_env(os.environ))
    # a remote JSONL part resumes from a byte offset, as a local one does
    part = spec.parts[0]
    source, close = open_part(spec, part, spec.part_spec(part))
    rows = list(source.rows(Position()))
    resumed = list(source.rows(Position(rows=100, in_offset=rows[99].end_offset,
                                        in_line=rows[99].end_line)))
    close()
    assert source.total is None and len(rows) == 150
    assert [r.custom_id for r in resumed] == [f"c{i}" for i in range(100, 150)]
    async with running_worker(redis_url, max_batch_size=64):
        report = await run_dataset(spec, Endpoints(redis_url))
    assert report.rows == 240 and report.failed == 0 and report.status == "finished"
    for name, x in inputs.items():
        out = read_jsonl(tmp_path / "out" / "day=1" / name)
        assert [r["row"] for r in out] == list(range(len(x)))
        np.testing.assert_allclose(np.array([r["outputs"] for r in out], np.float32),
                                   mlp_reference(x), **TOL)
