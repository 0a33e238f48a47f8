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

from batchfleet.producers.bulk.errors import BulkError
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sink_npy import NpySink
from batchfleet.producers.bulk.sinks import Sink, SinkBase, dumps, output_record, sync
from batchfleet.producers.bulk.spec import JobSpec
from batchfleet.schemas.envelopes import ErrorInfo, Result

BATCH_ROWS = 65_536


def staging(path: Path) -> Path:
    return path.with_name(f".{path.name}.retry")


def short(spec: JobSpec) -> BulkError:
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
                raise short(self._spec)
            if self._copied < row.index:
                self._new.write(line)
            self._copied += 1
        self._new.write(dumps(output_record(row, result)))
        return error

    def finish(self) -> Position:
        shutil.copyfileobj(self._old, self._new)
        sync(self._new)
        return self._commit()

    def close(self) -> None:
        self._old.close()
        self._new.close()
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
    if spec.format == "parquet":  # pyarrow (the bulk extra) only here
        from batchfleet.producers.bulk.merge_parquet import ParquetMerger

        return ParquetMerger(spec)
    return NpyMerger(spec, total or 0)


def discard_staging(spec: JobSpec) -> None:
    for path in (spec.output, spec.errors):
        staging(path).unlink(missing_ok=True)
