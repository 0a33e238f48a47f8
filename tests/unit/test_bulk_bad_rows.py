"""Bulk rows no input can kill, without servers: every bad row is one ``invalid_row``.

Also the pieces that stop a hopeless job early (identical failures, an ID column
stacked into the features), the ``--dtype`` hint, and the check that the files
a checkpoint counts on are still there.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchfleet.producers.bulk.errors import EarlyStopError, OutputMissingError
from batchfleet.producers.bulk.files import check_files
from batchfleet.producers.bulk.guard import EarlyStop, dtype_hint, over_rate, with_hint
from batchfleet.producers.bulk.rows import MAX_ROW_BYTES, Position, Row, encode_problem
from batchfleet.producers.bulk.sink_npy import status_path
from batchfleet.producers.bulk.sink_parquet import parts_dir
from batchfleet.producers.bulk.sinks import dumps, output_record
from batchfleet.producers.bulk.source_parquet import ParquetSource
from batchfleet.producers.bulk.sources import JsonlSource, parse_jsonl, read_line
from batchfleet.producers.bulk.spec import JobSpec, request_id_for
from batchfleet.schemas.envelopes import ErrorInfo, Result

pytestmark = pytest.mark.unit

_65_NAMED = json.dumps({"custom_id": "wide", "inputs": {f"t{i}": [1.0] for i in range(65)}})
BAD_ROWS: list[tuple[str, bytes, str]] = [
    ("too many tensors", _65_NAMED.encode(), "65 named tensors; a request carries at most 64"),
    ("too deep for numpy", b'{"inputs": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}",
     "not a supported tensor"),
    ("too deep for json", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "nested too deeply"),
    ("too big", b'{"inputs": [' + b"0," * 3_000_000 + b"0]}", "a request carries at most"),
    ("strings", b'{"inputs": ["a", "b"]}', "not a tensor"),
    ("null", b'{"inputs": null}', "not a tensor"),
    ("huge integer", b'{"inputs": [100000000000000000000000]}', "not a tensor"),
    ("ragged", b'{"inputs": [[1, 2], [3]]}', "not a tensor"),
    ("empty map", b'{"inputs": {}}', "empty map"),
    ("bad named tensor", b'{"inputs": {"a": [1], "b": "x"}}', "not a tensor"),
    ("lone surrogate name", b'{"inputs": {"\\ud800": [1]}}', "not valid UTF-8"),
    ("bad UTF-8", b'{"custom_id": "\xff\xfe", "inputs": [1]}', "not valid UTF-8"),
    ("bad JSON", b'{"inputs": [1, 2', "not valid JSON"),
    ("not an object", b"[1, 2, 3]", "expected a JSON object"),
    ("no inputs", b'{"custom_id": "x", "input": [1]}', "no 'inputs' field"),
    # as the gateway refuses them (422): NaN and infinity are no input
    ("NaN", b'{"inputs": [1.0, NaN]}', "numbers must be finite"),
    ("Infinity", b'{"inputs": [Infinity, 2.0]}', "numbers must be finite"),
    ("named -Infinity", b'{"inputs": {"a": [1.0], "b": [-Infinity]}}', "numbers must be finite"),
    ("over float32", b'{"inputs": [1e300]}', "numbers must be finite (and fit in float32)"),
]


@pytest.mark.parametrize(("raw", "expected"), [(r, e) for _, r, e in BAD_ROWS],
                         ids=[name for name, _, _ in BAD_ROWS])
def test_each_bad_row_is_an_invalid_row_naming_its_line(raw: bytes, expected: str) -> None:
    row = parse_jsonl(raw, 6, 7, 1234, "custom_id", "auto")
    assert row.error is not None and row.inputs is None
    assert row.error.type == "invalid_row" and not row.error.retryable
    assert row.error.message.startswith("line 7: ") and expected in row.error.message
    assert (row.index, row.line, row.end_offset, row.end_line) == (6, 7, 1234, 7)


def test_accepted_rows_are_rows_the_envelope_accepts() -> None:
    named = parse_jsonl(json.dumps({"inputs": {f"t{i}": [1.0] for i in range(64)}}).encode(),
                        0, 1, 0, "custom_id", "auto")
    assert named.error is None and encode_problem(named.inputs) is None
    assert encode_problem({f"t{i}": np.zeros(1) for i in range(65)}) is not None
    assert MAX_ROW_BYTES < 16 * 1024 * 1024


def test_a_jsonl_source_with_bad_rows_and_an_over_limit_line_carries_on(tmp_path: Path
                                                                       ) -> None:
    good = [json.dumps({"custom_id": f"c{i}", "inputs": [float(i)] * 3}) for i in range(6)]
    long_line = json.dumps({"custom_id": "long", "inputs": [0.5] * 500})
    lines = [good[0], BAD_ROWS[0][1].decode(), good[1], long_line, "", good[2],
             BAD_ROWS[12][1].decode(), good[3], good[4], long_line]  # the last has no newline
    (tmp_path / "in.jsonl").write_text("\n".join(lines))
    source = JsonlSource(tmp_path / "in.jsonl", "auto", "custom_id", max_line_bytes=1000)
    rows = list(source.rows(Position()))
    assert [r.index for r in rows] == list(range(9))  # the blank line is not a row
    assert [r.line for r in rows] == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    bad = {r.line or 0: r.error.message for r in rows if r.error is not None}
    assert sorted(bad) == [2, 4, 7, 10]
    assert bad[4] == (f"line 4 is {len(long_line):,} bytes, over the 1,000-byte limit "
                      "(--max-line-bytes)")
    assert bad[10].startswith(f"line 10 is {len(long_line):,} bytes")
    assert [r.custom_id for r in rows if r.error is None] == ["c0", "c1", "c2", "c3", "c4"]
    # a resume just after the long line reads exactly the same rows from there on
    after = rows[3]
    resumed = list(source.rows(Position(rows=4, in_offset=after.end_offset,
                                        in_line=after.end_line)))
    assert [(r.index, r.line, r.custom_id, r.end_offset) for r in resumed] == \
        [(r.index, r.line, r.custom_id, r.end_offset) for r in rows[4:]]
    assert rows[-1].end_offset == (tmp_path / "in.jsonl").stat().st_size
    # a retry pass finds the long row by index; with a larger limit it parses
    wide = JsonlSource(tmp_path / "in.jsonl", "auto", "custom_id", max_line_bytes=5000)
    (again,) = wide.rows(Position(), wanted=iter([3]))
    assert again.error is None and again.custom_id == "long"


def test_read_line_skips_a_long_line_in_chunks_without_holding_it() -> None:
    f = io.BytesIO(b"ab\n" + b"x" * 5_000_000 + b"\ncd")
    assert read_line(f, 10) == (b"ab\n", 3, 2)
    assert read_line(f, 10) == (None, 5_000_001, 5_000_000)
    assert read_line(f, 2) == (b"cd", 2, 2)
    assert read_line(f, 2) == (b"", 0, 0)
    assert read_line(io.BytesIO(b"abc\n"), 3) == (b"abc\n", 4, 3)  # the newline is free


def _failed(message: str, type_: str = "validation_error", retryable: bool = False) -> Result:
    return Result("j:0", "failed", error=ErrorInfo(type_, message, retryable))


def test_early_stop_when_the_first_rows_all_fail_the_same_way() -> None:
    guard = EarlyStop(3, ["column 'id' looks like a row ID"])
    guard.see(_failed("line 1: no 'inputs' field", "invalid_row"))
    guard.see(_failed("line 2: no 'inputs' field", "invalid_row"))  # numbers do not count
    with pytest.raises(EarlyStopError) as caught:
        guard.see(_failed("line 9: no 'inputs' field", "invalid_row"))
    assert str(caught.value) == (
        "stopped early: the first 3 rows all failed the same way (invalid_row: no 'inputs' "
        "field); column 'id' looks like a row ID. Fix the input or options, then run again "
        "with --restart (or --early-stop-rows 0 to score every row anyway)")
    assert not guard.armed


@pytest.mark.parametrize("second", [
    Result("j:1", "succeeded"),
    _failed("wrong dtype: expected float32, got int64"),  # a different failure
    _failed("wrong shape: ...", "model_error", retryable=True),  # not the input's fault
    Result("j:1", "expired", error=ErrorInfo("expired", "deadline passed")),
])
def test_early_stop_disarms_for_good_at_anything_else(second: Result) -> None:
    guard = EarlyStop(2)
    guard.see(_failed("wrong shape: expected float32[10], got float32[11]"))
    guard.see(second)
    for _ in range(5):
        guard.see(_failed("wrong shape: expected float32[10], got float32[11]"))
    assert not guard.armed


def test_early_stop_counts_rows_a_previous_run_saved_and_can_be_off() -> None:
    resumed = EarlyStop(3, seen=2)
    with pytest.raises(EarlyStopError, match="first 3 rows"):
        resumed.see(_failed("boom"))
    assert not EarlyStop(3, seen=3).armed and not EarlyStop(0).armed


@pytest.mark.parametrize(("failed", "rows", "max_rate", "over"), [
    (51, 100, 0.5, True), (50, 100, 0.5, False), (1, 100, 0.0, True), (0, 100, 0.0, False),
    (100, 100, 1.0, False), (3, 0, 0.5, False),
])
def test_over_rate_decides_the_failure_rate_stop(failed: int, rows: int, max_rate: float,
                                                 over: bool) -> None:
    assert over_rate(failed, rows, max_rate) is over


def test_early_stop_when_more_than_the_rate_of_the_first_rows_fail() -> None:
    guard = EarlyStop(4, max_rate=0.5)
    guard.see(_failed("line 1: wrong dtype: expected float32, got int64"))
    guard.see(Result("j:1", "succeeded"))
    guard.see(_failed("line 3: wrong dtype: expected float32, got int64"))
    with pytest.raises(EarlyStopError) as caught:
        guard.see(_failed("line 4: no 'inputs' field", "invalid_row"))
    assert str(caught.value) == (
        "stopped early: 3 of the first 4 rows failed (75%, over --early-stop-rate 0.5); "
        "most common (2): validation_error: wrong dtype: expected float32, got int64. Fix "
        "the input or options, then run again with --restart (or --early-stop-rate 1 to "
        "score every row anyway)")
    assert not guard.armed
    guard.see(_failed("boom"))  # decided once: later rows never stop the job


def test_failure_rate_stop_spares_retryable_failures_and_is_off_at_one() -> None:
    retryable = _failed("worker lost", "model_error", retryable=True)
    guard = EarlyStop(2, max_rate=0.4)
    guard.see(retryable)
    guard.see(Result("j:1", "succeeded"))  # 0 of 2 counted: the input is not to blame
    off = EarlyStop(2, max_rate=1.0)
    off.see(_failed("a"))
    off.see(_failed("b"))  # 100 % failed, but in two ways and the rate check is off
    resumed = EarlyStop(4, seen=2, failed=1, max_rate=0.5)  # a previous run: 1 of 2 failed
    resumed.see(_failed("c"))
    with pytest.raises(EarlyStopError, match="3 of the first 4 rows failed"):
        resumed.see(_failed("d"))


def test_dtype_hint_for_integers_sent_to_a_float_model() -> None:
    assert dtype_hint("wrong dtype: expected float32, got int64") == (
        "wrong dtype: expected float32, got int64 (whole numbers are read as integers: run "
        "with --dtype float32 to send them as floats)")
    assert "--dtype float16" in dtype_hint("wrong dtype: expected float16, got int32")
    for unchanged in ("wrong dtype: expected int64, got float32",
                      "wrong shape: expected float32[10], got float32[11]"):
        assert dtype_hint(unchanged) == unchanged
    hinted = with_hint(_failed("wrong dtype: expected float32, got int64"))
    assert hinted.error is not None and "--dtype float32" in hinted.error.message
    assert with_hint(hinted) == hinted  # never twice


def _id_trap(path: Path, n: int = 20) -> None:
    x = np.random.default_rng(0).random((n, 10))
    pq.write_table(pa.table({"id": np.arange(n), **{f"f{j}": x[:, j] for j in range(10)}}),
                   path)


def test_an_id_column_stacked_into_the_features_is_warned_about(tmp_path: Path) -> None:
    _id_trap(tmp_path / "in.parquet")
    spec = JobSpec.create("j", "m", tmp_path / "in.parquet", tmp_path / "out.parquet")
    source = ParquetSource(spec)
    assert source.features[0] == "id" and len(source.features) == 11
    (warning,) = source.warnings
    assert "column 'id' looks like a row ID" in warning and "--id-column id" in warning
    fixed = ParquetSource(JobSpec.create("j", "m", tmp_path / "in.parquet",
                                         tmp_path / "out.parquet", id_column="id"))
    assert len(fixed.features) == 10 and fixed.warnings == ()
    by_hand = ParquetSource(JobSpec.create("j", "m", tmp_path / "in.parquet",
                                           tmp_path / "out.parquet",
                                           feature_columns=("id", "f0")))
    assert by_hand.warnings == ()  # listed by hand: meant


def test_request_ids_of_a_restarted_job_are_new() -> None:
    assert request_id_for("job", 7, epoch=0) == "job:7"
    assert request_id_for("job", 7, epoch=2) == "job:7:e2"
    assert request_id_for("job", 7, 3, epoch=2) == "job:7:e2:r3"


def _spec(tmp_path: Path, suffix: str) -> JobSpec:
    source = tmp_path / f"in{suffix}"
    if suffix == ".npy":
        np.save(source, np.zeros((3, 2), np.float32))
    else:
        source.write_text("{}\n")
    return JobSpec.create("j", "m", source, tmp_path / f"out{suffix}")


def _assert_missing(spec: JobSpec, pos: Position, finished: bool, path: Path,
                    rows: int) -> None:
    with pytest.raises(OutputMissingError) as caught:
        check_files(spec, pos, finished)
    assert str(caught.value).startswith(f"output {path} ")
    assert f"the job state says {rows:,} rows" in str(caught.value)
    assert str(caught.value).endswith(
        f"run again with --restart to score from scratch, or restore {path}")


def test_check_files_jsonl(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ".jsonl")
    half = Position(rows=5, out_offset=100, err_offset=40)
    check_files(spec, Position(), finished=False)  # a new job needs nothing
    _assert_missing(spec, half, False, spec.output, 5)
    spec.output.write_bytes(b"x" * 99)
    with pytest.raises(OutputMissingError, match=r"has 99 bytes but the job state says 5 rows "
                                                 r"\(100 bytes\) are done"):
        check_files(spec, half, False)
    spec.output.write_bytes(b"x" * 100)
    _assert_missing(spec, half, False, spec.errors, 5)
    check_files(spec, half, True, errors=False)  # a finished job that is only reported
    spec.errors.write_bytes(b"x" * 40)
    check_files(spec, half, False)
    spec.output.unlink()  # a finished job with no rows still had an output file
    _assert_missing(spec, Position(), True, spec.output, 0)


def test_check_files_npy_and_parquet(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ".npy")
    _assert_missing(spec, Position(rows=2, failed=2), False, status_path(spec.output), 2)
    np.save(status_path(spec.output), np.zeros(3, np.uint8))
    check_files(spec, Position(rows=2, failed=2), True)  # no success: no outputs array
    _assert_missing(spec, Position(rows=2, succeeded=1), False, spec.output, 2)
    pq_spec = _spec(tmp_path, ".parquet")
    half: Any = Position(rows=10, parts=2)
    _assert_missing(pq_spec, half, False, parts_dir(pq_spec) / "part-000000.parquet", 10)
    pq_spec.output.write_bytes(b"merged")  # merged, then killed before the checkpoint
    check_files(pq_spec, half, False)
    pq_spec.output.unlink()
    _assert_missing(pq_spec, Position(rows=10, parts=2), True, pq_spec.output, 10)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_a_number_the_dtype_cannot_hold_is_an_invalid_row(dtype: str) -> None:
    """``--dtype float16``: 1e10 would become infinity; NaN is refused in any float dtype."""
    big = parse_jsonl(b'{"inputs": [1e10]}', 0, 1, 20, "custom_id", dtype)
    nan = parse_jsonl(b'{"inputs": [NaN]}', 1, 2, 20, "custom_id", dtype)
    assert nan.error is not None and "finite" in nan.error.message
    if dtype == "float16":
        assert big.error is not None and "fit in float16" in big.error.message
    else:
        assert big.error is None and big.inputs is not None


def _strict(line: bytes) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"not strict JSON: {name} in {line!r}")
    return json.loads(line, parse_constant=refuse)


def test_output_lines_are_strict_json_whatever_the_model_or_the_ids_hold() -> None:
    """A model may turn finite inputs into NaN: shown as null, as the gateway shows it."""
    row = Row(3, np.zeros(2, np.float32), custom_id=float("nan"))
    out = _strict(dumps(output_record(row, Result("r3", "succeeded",
                                                  np.array([np.nan, 1.5, -np.inf])))))
    assert out == {"custom_id": None, "row": 3, "status": "succeeded",
                   "outputs": [None, 1.5, None]}
    named = _strict(dumps(output_record(Row(4, None, custom_id="c4"), Result(
        "r4", "succeeded", {"a": np.array([np.inf], np.float32)}))))
    assert named["outputs"] == {"a": [None]}
