"""Parquet output: durable part files while running, one Parquet file at the end.

A Parquet file is only readable once its footer is written, so it cannot be
truncated back to a checkpoint like JSONL. Instead rows go to numbered part
files (``part_rows`` rows or ``part_s`` seconds each, written to a temporary
name, fsynced, then renamed); a checkpoint counts whole parts, and a resume
deletes any part after it. ``finish()`` streams the parts, in order, into the
final file and only then removes them, so a crash during the merge is
repaired by merging again.

Columns: the input's ID column (type unchanged, when it has one), ``row``
(int64), ``status`` (string), ``outputs`` (a list of the output dtype,
flattened row-major; null where the row failed), and the degraded marks JSONL rows
carry (docs/degradation.md): ``degraded`` (bool), ``degraded_reason`` and
``fallback`` (string) and ``degraded_error`` (struct of type, message, retryable),
null where the row is not degraded.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sinks import SinkBase, sync
from batchfleet.producers.bulk.spec import JobSpec, Tuning
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.tensors import Array

#: Part-file metadata key: "1" when the part holds real outputs (so their type is known).
_TYPED = b"batchfleet.outputs_typed"
_MERGE_ROWS = 131_072
UNSUPPORTED = "unsupported_output"


def parts_dir(spec: JobSpec) -> Path:
    return spec.output.with_name(f".{spec.output.name}.{spec.job_id}.parts")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def outputs_array(outputs: list[Array | None], dtype: np.dtype[Any]) -> Any:
    """A list<dtype> Arrow column from per-row flat arrays (None: a null cell)."""
    lengths = np.fromiter((0 if o is None else o.size for o in outputs), np.int64, len(outputs))
    offsets = np.zeros(len(outputs) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [o for o in outputs if o is not None]
    values = np.concatenate(present).astype(dtype, copy=False) if present else np.empty(0, dtype)
    mask = pa.array(np.fromiter((o is None for o in outputs), bool, len(outputs)))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=mask)


#: The degraded marks' columns, after ``outputs``.
ERROR_TYPE = pa.struct([("type", pa.string()), ("message", pa.string()),
                        ("retryable", pa.bool_())])
MARK_TYPES: dict[str, Any] = {"degraded": pa.bool_(), "degraded_reason": pa.string(),
                              "fallback": pa.string(), "degraded_error": ERROR_TYPE}
#: A row that is not degraded (failed rows included).
NO_MARKS: tuple[bool, None, None, None] = (False, None, None, None)


def marks(result: Result, status: str) -> tuple[bool, str | None, str | None,
                                               dict[str, Any] | None]:
    """A stored row's (degraded, degraded_reason, fallback, degraded_error): a fallback's
    answer is never mistaken for the model's, in Parquet as in JSONL."""
    if status != "succeeded" or not result.degraded:
        return NO_MARKS
    error = result.degraded_error
    return (True, result.degraded_reason, result.fallback,
            None if error is None else error.to_wire())


def mark_columns(rows: list[tuple[bool, str | None, str | None, dict[str, Any] | None]]
                 ) -> dict[str, Any]:
    """The four mark columns of ``rows`` (``marks`` of each), by name."""
    return {name: pa.array([r[i] for r in rows], type=kind)
            for i, (name, kind) in enumerate(MARK_TYPES.items())}


def parquet_cell(result: Result, error: ErrorInfo | None
                 ) -> tuple[str, Array | None, ErrorInfo | None]:
    """(status, flat outputs or None, error) of one row as the Parquet output stores it."""
    if error is not None:
        return result.status, None, error
    if isinstance(result.outputs, dict) or result.outputs is None:
        return "failed", None, ErrorInfo(UNSUPPORTED, "Parquet output holds one tensor per "
                                         "row; the model returned named tensors (use JSONL)")
    return "succeeded", np.asarray(result.outputs).reshape(-1), None


class ParquetSink(SinkBase):
    def __init__(self, spec: JobSpec, start: Position, id_type: Any, tuning: Tuning) -> None:
        super().__init__(spec, start)
        self._spec, self._id_type, self._tuning = spec, id_type, tuning
        self._dir = parts_dir(spec)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._n_parts = start.parts
        for stale in self._dir.iterdir():  # written after the checkpoint: rows are redone
            if not stale.name.endswith(".parquet") or self._part_no(stale) >= start.parts:
                stale.unlink()
        self._dtype: np.dtype[Any] | None = None
        self._ids: list[Any] = []
        self._rows: list[int] = []
        self._statuses: list[str] = []
        self._outputs: list[Array | None] = []
        self._marks: list[tuple[bool, str | None, str | None, dict[str, Any] | None]] = []
        self._last_part = time.monotonic()

    @staticmethod
    def _part_no(path: Path) -> int:
        try:
            return int(path.name.split("-")[1].split(".")[0])
        except (IndexError, ValueError):
            return -1

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        status, flat, error = parquet_cell(result, error)
        if flat is not None:
            self._dtype = self._dtype or flat.dtype
        self._ids.append(row.custom_id)
        self._rows.append(row.index)
        self._statuses.append(status)
        self._outputs.append(flat)
        self._marks.append(marks(result, status))
        return error

    def _parts(self) -> int:
        return self._n_parts

    def _table(self) -> Any:
        columns: dict[str, Any] = {}
        if self._id_type is not None:
            columns[self._spec.id_column] = pa.array(self._ids, type=self._id_type)
        columns["row"] = pa.array(self._rows, type=pa.int64())
        columns["status"] = pa.array(self._statuses, type=pa.string())
        columns["outputs"] = outputs_array(self._outputs, self._dtype or np.dtype(np.float32))
        columns.update(mark_columns(self._marks))
        typed = b"1" if any(o is not None for o in self._outputs) else b"0"
        return pa.table(columns).replace_schema_metadata({_TYPED: typed})

    def _write_part(self) -> None:
        final = self._dir / f"part-{self._n_parts:06d}.parquet"
        tmp = final.with_suffix(".tmp")
        pq.write_table(self._table(), tmp)
        _fsync_path(tmp)
        os.replace(tmp, final)
        _fsync_path(self._dir)
        sync(self._errors)
        self._n_parts += 1
        self._ids, self._rows, self._statuses, self._outputs = [], [], [], []
        self._marks = []
        self._last_part = time.monotonic()

    def durable(self, force: bool = False) -> Position | None:
        if not self._rows:
            return None
        due = time.monotonic() - self._last_part >= self._tuning.part_s
        if len(self._rows) < self._tuning.part_rows and not due and not force:
            return None
        self._write_part()
        self._pos = self.current()
        return self._pos

    def finish(self) -> Position:
        if self._rows:
            self._write_part()
        sync(self._errors)
        self._pos = self.current()
        self.close()
        merge_parts(self._dir, self._spec.output, self._n_parts)
        return self._pos


def merge_parts(directory: Path, output: Path, n_parts: int) -> None:
    """Stream parts 0..n-1 into ``output`` (atomically), then delete them."""
    parts = [directory / f"part-{i:06d}.parquet" for i in range(n_parts)]
    if n_parts and not parts[0].exists() and output.exists():
        shutil.rmtree(directory, ignore_errors=True)
        return  # merged and cleaned up before a crash: nothing left to do
    schemas = [pq.read_schema(p) for p in parts]
    typed = [s for s in schemas if (s.metadata or {}).get(_TYPED) == b"1"]
    schema = (typed or schemas or [None])[0]
    tmp = output.with_name(f".{output.name}.merging")
    writer = None
    try:
        if schema is None:  # an empty input: still write a valid, empty file
            schema = pa.schema([("row", pa.int64()), ("status", pa.string()),
                                ("outputs", pa.list_(pa.float32())), *MARK_TYPES.items()])
        schema = schema.remove_metadata()
        writer = pq.ParquetWriter(tmp, schema)
        pending: list[Any] = []
        rows = 0
        for part in parts:
            table = pq.read_table(part).replace_schema_metadata(None).cast(schema)
            pending.append(table)
            rows += table.num_rows
            if rows >= _MERGE_ROWS:
                writer.write_table(pa.concat_tables(pending))
                pending, rows = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending))
        writer.close()
        writer = None
        _fsync_path(tmp)
        os.replace(tmp, output)
    finally:
        if writer is not None:
            writer.close()
    shutil.rmtree(directory, ignore_errors=True)
