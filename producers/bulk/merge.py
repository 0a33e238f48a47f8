"""Folding a ``--retry-failed`` pass into a finished job's output, streaming.

The output has exactly one record per input row, in row order, so record
``i`` *is* row ``i``: a retried row replaces its record and every other record
is copied through unchanged, without parsing (JSONL) or a batch at a time
(Parquet). Both are written beside the originals and renamed over them at the
end, so an interrupted retry leaves the job's files as they were. The new
errors file lists only the rows that failed again. ``.npy`` outputs are
memory maps and are patched in place (rewriting a row is idempotent).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from batchfleet.producers.bulk.errors import BulkError
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sink_npy import NpySink
from batchfleet.producers.bulk.sink_parquet import parquet_cell
from batchfleet.producers.bulk.sinks import Sink, SinkBase, dumps, output_record, sync
from batchfleet.producers.bulk.spec import JobSpec
from batchfleet.schemas.envelopes import ErrorInfo, Result

_BATCH_ROWS = 65_536


def staging(path: Path) -> Path:
    return path.with_name(f".{path.name}.retry")


def _short(spec: JobSpec) -> BulkError:
    return BulkError(f"{spec.output} has fewer records than the job has rows: it was changed "
                     "after the job finished; run a new job instead")


class _Replacing(SinkBase):
    """Errors go to a staging file; ``finish`` renames staging files over the originals."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec, Position(), staging(spec.errors))
        self._spec = spec

    def durable(self, force: bool = False) -> Position | None:
        return None  # an interrupted retry is redone; the result store dedupes its requests

    def _commit(self) -> Position:
        sync(self._errors)
        pos = self.current()
        self.close()
        for path in (self._spec.output, self._spec.errors):
            if staging(path).exists():
                os.replace(staging(path), path)
        return pos


class JsonlMerger(_Replacing):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        self._old = spec.output.open("rb")
        self._new = staging(spec.output).open("wb")
        self._copied = 0

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        while self._copied <= row.index:
            line = self._old.readline()
            if not line:
                raise _short(self._spec)
            if self._copied < row.index:
                self._new.write(line)
            self._copied += 1
        self._new.write(dumps(output_record(row, result.status, result.outputs)))
        return error

    def finish(self) -> Position:
        shutil.copyfileobj(self._old, self._new)
        sync(self._new)
        return self._commit()

    def close(self) -> None:
        self._old.close()
        self._new.close()
        super().close()


class ParquetMerger(_Replacing):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        self._file = pq.ParquetFile(spec.output)
        self._schema = self._file.schema_arrow
        self._value_type = self._schema.field("outputs").type.value_type
        self._batches = self._file.iter_batches(batch_size=_BATCH_ROWS)
        self._writer: Any = pq.ParquetWriter(staging(spec.output), self._schema)
        self._batch: Any = None
        self._base = 0
        self._fixes: dict[int, tuple[str, Any]] = {}

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        while self._batch is None or row.index >= self._base + self._batch.num_rows:
            self._write_batch()
            self._batch = next(self._batches, None)
            if self._batch is None:
                raise _short(self._spec)
        status, flat, error = parquet_cell(result, error)
        self._fixes[row.index - self._base] = (status, flat)
        return error

    def _write_batch(self) -> None:
        if self._batch is None:
            return
        batch = self._batch
        if self._fixes:
            statuses = batch.column("status").to_pylist()
            outputs = batch.column("outputs").to_pylist()
            for k, (status, flat) in self._fixes.items():
                statuses[k], outputs[k] = status, None if flat is None else flat.tolist()
            columns = {"status": pa.array(statuses, type=pa.string()),
                       "outputs": pa.array(outputs, type=pa.list_(self._value_type))}
            batch = pa.RecordBatch.from_arrays(
                [columns.get(name, batch.column(name)) for name in self._schema.names],
                schema=self._schema)
        self._writer.write_batch(batch)
        self._base += self._batch.num_rows
        self._batch, self._fixes = None, {}

    def finish(self) -> Position:
        self._write_batch()
        for batch in self._batches:
            self._writer.write_batch(batch)
        self._writer.close()
        self._writer = None
        return self._commit()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        super().close()


class NpyMerger(NpySink):
    """Patches the memory-mapped outputs and status in place; only the errors file is staged."""

    def __init__(self, spec: JobSpec, total: int) -> None:
        super().__init__(spec, Position(rows=total), total, staging(spec.errors))
        self._errors_path = spec.errors

    def finish(self) -> Position:
        pos = super().finish()
        os.replace(staging(self._errors_path), self._errors_path)
        return pos


def open_merger(spec: JobSpec, total: int | None) -> Sink:
    if spec.format == "jsonl":
        return JsonlMerger(spec)
    if spec.format == "parquet":
        return ParquetMerger(spec)
    return NpyMerger(spec, total or 0)


def discard_staging(spec: JobSpec) -> None:
    for path in (spec.output, spec.errors):
        staging(path).unlink(missing_ok=True)
