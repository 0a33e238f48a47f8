"""Replacing the failed rows of a Parquet output (``--retry-failed``), batch by batch.

Apart from ``merge.py`` so that a retry of a JSONL or npy job needs no pyarrow.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from batchfleet.producers.bulk.merge import BATCH_ROWS, _Replacing, short, staging
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sink_parquet import MARK_TYPES, mark_columns, marks, parquet_cell
from batchfleet.producers.bulk.spec import JobSpec
from batchfleet.schemas.envelopes import ErrorInfo, Result


class ParquetMerger(_Replacing):
    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec)
        self._file = pq.ParquetFile(spec.output)
        self._schema = self._file.schema_arrow
        self._value_type = self._schema.field("outputs").type.value_type
        self._batches = self._file.iter_batches(batch_size=BATCH_ROWS)
        self._writer: Any = pq.ParquetWriter(staging(spec.output), self._schema)
        self._batch: Any = None
        self._base = 0
        self._fixes: dict[int, tuple[str, Any, Any]] = {}
        #: An output written before the marks existed has no mark columns: none added.
        self._marked = all(name in self._schema.names for name in MARK_TYPES)

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        while self._batch is None or row.index >= self._base + self._batch.num_rows:
            self._write_batch()
            self._batch = next(self._batches, None)
            if self._batch is None:
                raise short(self._spec)
        status, flat, error = parquet_cell(result, error)
        self._fixes[row.index - self._base] = (status, flat, marks(result, status))
        return error

    def _write_batch(self) -> None:
        if self._batch is None:
            return
        batch = self._batch
        if self._fixes:
            statuses = batch.column("status").to_pylist()
            outputs = batch.column("outputs").to_pylist()
            marked = list(zip(*(batch.column(n).to_pylist() for n in MARK_TYPES),
                              strict=True)) if self._marked else []
            for k, (status, flat, mark) in self._fixes.items():
                statuses[k], outputs[k] = status, None if flat is None else flat.tolist()
                if self._marked:
                    marked[k] = mark
            columns = {"status": pa.array(statuses, type=pa.string()),
                       "outputs": pa.array(outputs, type=pa.list_(self._value_type)),
                       **(mark_columns(marked) if self._marked else {})}
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
