"""Bulk-job file handling without servers: specs, streaming readers, in-order sinks, merges."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from batchfleet.producers.bulk.errors import BulkError, InputFormatError
from batchfleet.producers.bulk.merge import NpyMerger
from batchfleet.producers.bulk.merge_parquet import ParquetMerger
from batchfleet.producers.bulk.progress import BarProgress
from batchfleet.producers.bulk.report import JobReport, exit_code, summary_table
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sink_npy import NpySink
from batchfleet.producers.bulk.sink_parquet import ParquetSink, parts_dir
from batchfleet.producers.bulk.sinks import JsonlSink
from batchfleet.producers.bulk.source_parquet import ParquetSource
from batchfleet.producers.bulk.sources import JsonlSource, NpySource, count_lines
from batchfleet.producers.bulk.spec import JobSpec, Tuning, check_job_id, request_id_for
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.errors import ConfigError

pytestmark = pytest.mark.unit


def _ok(row: int, value: float) -> Result:
    return Result(f"j:{row}", "succeeded", outputs=np.array([value], np.float32))


def _failed(row: int) -> Result:
    return Result(f"j:{row}", "failed", error=ErrorInfo("model_error", "boom"), attempts=3)


def _jsonl(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"custom_id": i, "inputs": [float(i)] * 3}) + "\n"
                            for i in range(n)))


def test_job_ids_and_request_ids() -> None:
    assert check_job_id("nightly-20250101") == "nightly-20250101"
    for bad in ("", "has:colon", "has space", "-leading", "x" * 81):
        with pytest.raises(ConfigError):
            check_job_id(bad)
    assert request_id_for("job", 7) == "job:7"
    assert request_id_for("job", 7, 2) == "job:7:r2"


def test_spec_refuses_mismatched_formats_and_missing_inputs(tmp_path: Path) -> None:
    _jsonl(tmp_path / "in.jsonl", 1)
    with pytest.raises(ConfigError, match="format family"):
        JobSpec.create("j", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "out.parquet")
    with pytest.raises(InputFormatError, match="does not exist"):
        JobSpec.create("j", "demo-mlp", tmp_path / "nope.jsonl", tmp_path / "out.jsonl")
    with pytest.raises(InputFormatError, match="cannot tell the format"):
        JobSpec.create("j", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "out.csv")
    spec = JobSpec.create("j", "demo-mlp", tmp_path / "in.jsonl", tmp_path / "o.jsonl")
    assert spec.errors == (tmp_path / "o.j.errors.jsonl").resolve()  # one per job ID
    with pytest.raises(ConfigError):
        Tuning(window=0).validated()


def test_count_lines(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1\n2\n3")
    (tmp_path / "b").write_bytes(b"1\n2\n")
    (tmp_path / "c").write_bytes(b"")
    assert [count_lines(tmp_path / n) for n in "abc"] == [3, 2, 0]


def test_jsonl_source_resumes_from_a_byte_offset_and_filters_rows(tmp_path: Path) -> None:
    _jsonl(tmp_path / "in.jsonl", 10)
    source = JsonlSource(tmp_path / "in.jsonl", "auto", "custom_id")
    rows = list(source.rows(Position()))
    assert [r.index for r in rows] == list(range(10)) and source.total == 10
    assert rows[0].inputs.dtype == np.float32  # type: ignore[union-attr]
    mid = rows[3]
    resumed = list(source.rows(Position(rows=4, in_offset=mid.end_offset, in_line=mid.end_line)))
    assert [(r.index, r.line, r.custom_id) for r in resumed] == \
        [(r.index, r.line, r.custom_id) for r in rows[4:]]
    picked = list(source.rows(Position(), wanted=iter([1, 5, 9])))
    assert [r.custom_id for r in picked] == [1, 5, 9]


def test_parquet_source_starts_mid_row_group_and_marks_null_cells(tmp_path: Path) -> None:
    n = 10_000
    cells: list[Any] = [[float(i)] * 4 for i in range(n)]
    cells[5000], cells[6000] = None, [1.0, None, 2.0, 3.0]
    pq.write_table(pa.table({"custom_id": list(range(n)),
                             "inputs": pa.array(cells, pa.list_(pa.float64()))}),
                   tmp_path / "in.parquet", row_group_size=3000)
    spec = JobSpec.create("j", "m", tmp_path / "in.parquet", tmp_path / "out.parquet")
    source = ParquetSource(spec)
    rows = list(source.rows(Position(rows=4990)))
    assert [r.index for r in rows] == list(range(4990, n)) and source.total == n
    assert [r.custom_id for r in rows[:2]] == [4990, 4991]
    assert rows[0].inputs.dtype == np.float32 and rows[0].inputs.tolist() == [4990.0] * 4  # type: ignore[union-attr]
    assert "inputs is null" in rows[10].error.message  # type: ignore[union-attr]
    assert "null elements" in rows[1010].error.message  # type: ignore[union-attr]
    picked = list(source.rows(Position(), wanted=iter([0, 2999, 3000, 9999])))
    assert [r.index for r in picked] == [0, 2999, 3000, 9999]


def test_parquet_source_stacks_feature_columns(tmp_path: Path) -> None:
    pq.write_table(pa.table({"custom_id": ["a", "b"], "x": [1, 2], "y": [0.5, 1.5],
                             "note": ["n", "m"]}), tmp_path / "in.parquet")
    source = ParquetSource(JobSpec.create("j", "m", tmp_path / "in.parquet",
                                          tmp_path / "out.parquet"))
    assert source.features == ("x", "y")
    rows = list(source.rows(Position()))
    assert rows[1].inputs.tolist() == [2.0, 1.5] and rows[1].custom_id == "b"  # type: ignore[union-attr]
    with pytest.raises(InputFormatError, match="not in the file"):
        ParquetSource(JobSpec.create("j", "m", tmp_path / "in.parquet",
                                     tmp_path / "out.parquet", feature_columns=("z",)))


def test_npy_source_reads_through_a_memory_map(tmp_path: Path) -> None:
    np.save(tmp_path / "in.npy", np.arange(50, dtype=np.float64).reshape(10, 5))
    source = NpySource(tmp_path / "in.npy", "auto")
    rows = list(source.rows(Position(rows=8)))
    assert [r.index for r in rows] == [8, 9] and rows[0].inputs.dtype == np.float32  # type: ignore[union-attr]
    assert [r.index for r in source.rows(Position(), wanted=iter([3, 42]))] == [3]


def test_jsonl_sink_truncates_to_the_checkpoint_on_resume(tmp_path: Path) -> None:
    _jsonl(tmp_path / "in.jsonl", 1)
    spec = JobSpec.create("j", "m", tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    sink = JsonlSink(spec, Position())
    for i in range(5):
        sink.write(Row(i, None, f"c{i}"), _failed(i) if i == 2 else _ok(i, i))
    saved = sink.durable()
    assert saved is not None and (saved.rows, saved.succeeded, saved.failed) == (5, 4, 1)
    sink.write(Row(5, None), _failed(5))  # written after the checkpoint, then "killed"
    sink.durable()
    sink.close()
    resumed = JsonlSink(spec, saved)
    resumed.write(Row(5, None, "c5"), _ok(5, 5))
    final = resumed.finish()
    lines = [json.loads(x) for x in spec.output.read_text().splitlines()]
    assert [x["row"] for x in lines] == [0, 1, 2, 3, 4, 5] and lines[5]["status"] == "succeeded"
    errors = [json.loads(x) for x in spec.errors.read_text().splitlines()]
    assert [e["row"] for e in errors] == [2] and final.failed == 1
    with pytest.raises(BulkError, match=r"run again with --restart .* or restore"):
        JsonlSink(spec, Position(out_offset=10**9))


def test_parquet_sink_parts_resume_and_merge(tmp_path: Path) -> None:
    pq.write_table(pa.table({"inputs": [[1.0]]}), tmp_path / "in.parquet")
    spec = JobSpec.create("j", "m", tmp_path / "in.parquet", tmp_path / "out.parquet")
    tuning = Tuning(part_rows=3)
    sink = ParquetSink(spec, Position(), pa.string(), tuning)
    saved = None
    for i in range(7):  # rows 0-2 all fail: that part's outputs type is unknown
        sink.write(Row(i, None, f"c{i}"), _failed(i) if i < 3 else _ok(i, i))
        saved = sink.durable() or saved
    assert saved is not None and (saved.rows, saved.parts) == (6, 2)
    sink.close()  # killed with row 6 buffered: it is not in any part
    resumed = ParquetSink(spec, saved, pa.string(), tuning)
    for i in range(6, 8):
        resumed.write(Row(i, None, f"c{i}"), _ok(i, i))
    final = resumed.finish()
    assert (final.rows, final.succeeded, final.failed) == (8, 5, 3)
    table = pq.read_table(spec.output)
    assert table.column("row").to_pylist() == list(range(8))
    assert table.column("custom_id").to_pylist() == [f"c{i}" for i in range(8)]
    assert table.column("outputs").to_pylist() == [None] * 3 + [[float(i)] for i in range(3, 8)]
    assert not parts_dir(spec).exists()
    # a retry pass replaces rows 0 and 2 in place, streaming
    merger = ParquetMerger(spec)
    merger.write(Row(0, None, "c0"), _ok(0, 100))
    merger.write(Row(2, None, "c2"), _failed(2))
    assert merger.finish().failed == 1
    table = pq.read_table(spec.output)
    assert table.column("outputs").to_pylist()[:3] == [[100.0], None, None]
    assert table.column("status").to_pylist()[:4] == ["succeeded", "failed", "failed",
                                                      "succeeded"]
    assert [json.loads(x)["row"] for x in spec.errors.read_text().splitlines()] == [2]


def test_npy_sink_writes_outputs_and_status_arrays(tmp_path: Path) -> None:
    np.save(tmp_path / "in.npy", np.zeros((4, 2), np.float32))
    spec = JobSpec.create("j", "m", tmp_path / "in.npy", tmp_path / "out.npy")
    sink = NpySink(spec, Position(), 4)
    sink.write(Row(0, None), _failed(0))
    sink.write(Row(1, None), _ok(1, 1.0))
    sink.write(Row(2, None), Result("j:2", "succeeded", outputs=np.zeros(3, np.float32)))
    sink.write(Row(3, None), _ok(3, 3.0))
    final = sink.finish()
    out, status = np.load(tmp_path / "out.npy"), np.load(tmp_path / "out.status.npy")
    assert final.failed == 2 and status.tolist() == [2, 1, 2, 1]
    assert np.isnan(out[0, 0]) and out[1, 0] == 1.0 and np.isnan(out[2, 0])
    errors = [json.loads(x) for x in spec.errors.read_text().splitlines()]
    assert errors[1]["error"]["type"] == "unsupported_output"
    merger = NpyMerger(spec, 4)
    merger.write(Row(0, None), _ok(0, 9.0))
    assert merger.finish().failed == 0
    assert np.load(tmp_path / "out.npy")[0, 0] == 9.0
    assert np.load(tmp_path / "out.status.npy").tolist() == [1, 1, 2, 1]


def test_position_round_trips_and_exit_codes() -> None:
    pos = Position(5, 10, 6, 100, 20, 1, 4, 1)
    raw = {k.encode(): str(v).encode() for k, v in pos.to_fields().items()}
    assert Position.from_fields({k.decode(): v.decode() for k, v in raw.items()}) == pos

    def report(status: str, failed: int) -> JobReport:
        return JobReport("j", "m", status, "", "", "", 100, 100 - failed, failed, 100, 0, 1.0)

    assert exit_code(report("finished", 0), 0.0) == 0
    assert exit_code(report("finished", 1), 0.0) == 1
    assert exit_code(report("finished", 1), 0.01) == 0
    assert exit_code(report("cancelled", 0), 0.0) == 3


def test_progress_bar_and_summary_table_render() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=150)
    bar = BarProgress(console)
    bar.start("job-1", 1000, 100, 2)
    bar.update(600, 7)
    bar.stop()
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert "job-1" in drawn and "600/1000" in drawn and "7 failed" in drawn
    assert "rows/s" in drawn and "ETA" in drawn
    console.print(summary_table(JobReport("job-1", "m", "finished", "in", "out", "err",
                                          1000, 990, 10, 900, 100, 3.0), 0.001))
    table = console.file.getvalue()  # type: ignore[attr-defined]
    assert "1.0000%" in table and "resumed from row" in table and "300 rows/s" in table
