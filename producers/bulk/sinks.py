"""Writing results in input order, with the errors file beside them, durably.

Every sink writes rows strictly in input order, so "the first N rows are on
disk" is a complete description of progress: that is the checkpoint, and a
resume truncates the files back to it and carries on. ``durable()`` flushes
and fsyncs before it reports a new position, so a checkpoint in Redis never
points past what is on disk. The errors file is JSONL for every format
(failures are few and should be readable with ``grep``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Protocol

from batchfleet.producers.bulk.errors import OutputMissingError
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sources import Source
from batchfleet.producers.bulk.spec import JobSpec, Tuning
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.json_form import finite, tensors_to_json
from batchfleet.schemas.tensors import Tensors


class Sink(Protocol):
    def write(self, row: Row, result: Result) -> None: ...

    def durable(self, force: bool = False) -> Position | None:
        """Make what was written durable (``force``: all of it, now); the new position,
        or None when nothing new became durable."""
        ...

    def current(self) -> Position:
        """Rows written so far, durable or not (for progress)."""
        ...

    def finish(self) -> Position: ...

    def close(self) -> None: ...


def open_truncated(path: Path, offset: int) -> IO[bytes]:
    """Open for appending at ``offset``, dropping anything written after the checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if path.exists() else 0
    if size < offset:  # files.check_files catches this first, with the row count
        raise OutputMissingError(f"output {path} has {size:,} bytes but the job state says "
                                 f"{offset:,} bytes are done: run again with --restart to "
                                 f"score from scratch, or restore {path}")
    f = path.open("ab")
    f.truncate(offset)
    f.seek(offset)  # truncate does not move the position, and tell() must be right
    return f


def sync(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())


def outputs_to_json(value: Tensors | None) -> Any:
    """As the gateway and webhooks show outputs: a NaN or infinity a model made is null."""
    return tensors_to_json(value)


def dumps(obj: dict[str, Any]) -> bytes:
    """One strict JSON line: a non-finite float anywhere (a ``custom_id`` of NaN) is null."""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(finite(obj), separators=(",", ":"), allow_nan=False)
    return text.encode() + b"\n"



def output_record(row: Row, result: Result) -> dict[str, Any]:
    """One output line; a fallback answer carries its marks, so it is never mistaken for
    the model's (docs/degradation.md)."""
    record = {"custom_id": row.custom_id, "row": row.index, "status": result.status,
              "outputs": outputs_to_json(result.outputs)}
    if result.degraded:
        record.update(degraded=True, degraded_reason=result.degraded_reason,
                      fallback=result.fallback, degraded_error=(
                          None if result.degraded_error is None
                          else result.degraded_error.to_wire()))
    return record


def error_record(row: Row, status: str, error: ErrorInfo, attempts: int) -> dict[str, Any]:
    record: dict[str, Any] = {"custom_id": row.custom_id, "row": row.index}
    if row.line is not None:
        record["line"] = row.line
    record.update(status=status, error=error.to_wire(), attempts=attempts)
    return record


def result_error(result: Result) -> ErrorInfo | None:
    if result.status == "succeeded":
        return None
    return result.error or ErrorInfo(result.status, f"the request ended {result.status}")


class SinkBase:
    """Counting, the errors file and the position; subclasses store the outputs."""

    def __init__(self, spec: JobSpec, start: Position, errors: Path | None = None) -> None:
        self._pos = start
        self._errors = open_truncated(errors or spec.errors, start.err_offset)
        self._succeeded, self._failed = start.succeeded, start.failed
        self._degraded = start.degraded
        self._next = start

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        """Store one row; return an error if its outputs cannot be stored in this format."""
        raise NotImplementedError

    def _out_offset(self) -> int:
        return 0

    def _parts(self) -> int:
        return 0

    def write(self, row: Row, result: Result) -> None:
        error = self._store(row, result, result_error(result))
        if error is None:
            self._succeeded += 1
            self._degraded += result.degraded
        else:
            self._failed += 1
            status = "failed" if result.status == "succeeded" else result.status
            self._errors.write(dumps(error_record(row, status, error, result.attempts)))
        self._next = Position(row.index + 1, row.end_offset, row.end_line, 0, 0, 0,
                              self._succeeded, self._failed, self._degraded)

    def current(self) -> Position:
        """Where the job is once what is written so far is synced."""
        n = self._next
        return Position(n.rows, n.in_offset, n.in_line, self._out_offset(),
                        self._errors.tell(), self._parts(), n.succeeded, n.failed,
                        n.degraded)

    def _sync_outputs(self) -> None:
        """Make the outputs written so far durable (format-specific)."""

    def durable(self, force: bool = False) -> Position | None:
        """Sync outputs and errors; the new checkpoint, or None if nothing moved."""
        self._sync_outputs()
        sync(self._errors)
        pos = self.current()
        if pos == self._pos:
            return None
        self._pos = pos
        return pos

    def finish(self) -> Position:
        self.durable()
        self.close()
        return self._pos

    def close(self) -> None:
        self._errors.close()


class JsonlSink(SinkBase):
    """One ``{"custom_id", "row", "status", "outputs"}`` object per input row, in order."""

    def __init__(self, spec: JobSpec, start: Position) -> None:
        super().__init__(spec, start)
        self._out = open_truncated(spec.output, start.out_offset)

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        self._out.write(dumps(output_record(row, result)))
        return error

    def _out_offset(self) -> int:
        return self._out.tell()

    def _sync_outputs(self) -> None:
        sync(self._out)

    def close(self) -> None:
        self._out.close()
        super().close()


def open_sink(spec: JobSpec, start: Position, source: Source, tuning: Tuning) -> Sink:
    if spec.format == "jsonl":
        return JsonlSink(spec, start)
    if spec.format == "npy":
        from batchfleet.producers.bulk.sink_npy import NpySink

        return NpySink(spec, start, source.total or 0)
    from batchfleet.producers.bulk.sink_parquet import ParquetSink

    return ParquetSink(spec, start, getattr(source, "id_type", None), tuning)
