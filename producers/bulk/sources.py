"""Streaming readers for the three input families: JSONL, Parquet and ``.npy``.

Each yields :class:`Row` objects one at a time from a resume point, so memory
stays flat however long the file is: JSONL is read line by line from a byte
offset, Parquet a record batch at a time from the right row group, and
``.npy`` through a read-only memory map. ``wanted`` (sorted row indices)
restricts a pass to some rows, which is how ``--retry-failed`` re-reads only
the rows that failed. A malformed row becomes an invalid ``Row`` naming its
line or column; it never stops the pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from batchfleet.producers.bulk.errors import InputFormatError
from batchfleet.producers.bulk.rows import Position, Row, coerce_tensors, invalid_row
from batchfleet.producers.bulk.spec import MAX_LINE_BYTES, JobSpec
from batchfleet.schemas.errors import ValidationError

_COUNT_CHUNK = 1 << 20
_SKIP_CHUNK = 1 << 20
NPY_BLOCK = 4096


class Source(Protocol):
    #: Rows in the input, where known cheaply (for progress and ETA only).
    total: int | None
    #: Likely mistakes in how the input is read (logged at the start, named by an early stop).
    warnings: tuple[str, ...]

    def rows(self, start: Position, wanted: Iterator[int] | None = None) -> Iterator[Row]: ...


def count_lines(path: Path) -> int:
    """Newlines in a file, in 1 MiB reads (about a second per GB): the JSONL progress total."""
    count, last = 0, b"\n"
    with path.open("rb") as f:
        while chunk := f.read(_COUNT_CHUNK):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def read_line(f: IO[bytes], limit: int) -> tuple[bytes | None, int, int]:
    """The next line as ``(raw, bytes consumed, length without the newline)``.

    ``raw`` is None for a line longer than ``limit``: it is skipped in 1 MiB reads,
    never held whole, so one giant line costs no more memory than the limit.
    At the end of the file: ``(b"", 0, 0)``.
    """
    raw = f.readline(limit + 1)
    ended = raw.endswith(b"\n")
    if len(raw) - ended <= limit:
        return raw, len(raw), len(raw) - ended
    consumed = len(raw)
    while not ended and (raw := f.readline(_SKIP_CHUNK)):
        consumed += len(raw)
        ended = raw.endswith(b"\n")
    return None, consumed, consumed - ended


def parse_jsonl(raw: bytes, index: int, line: int, end_offset: int, id_field: str,
                dtype: str) -> Row:
    """One JSONL line -> a Row, or an invalid Row that says what is wrong with the line."""
    where: dict[str, Any] = {"line": line, "end_offset": end_offset, "end_line": line}
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        return invalid_row(index, f"line {line}: not valid UTF-8: {exc}", **where)
    except ValueError as exc:
        return invalid_row(index, f"line {line}: not valid JSON: {exc}", **where)
    except RecursionError:
        return invalid_row(index, f"line {line}: JSON nested too deeply", **where)
    if not isinstance(obj, dict):
        return invalid_row(index, f"line {line}: expected a JSON object, got "
                                  f"{type(obj).__name__}", **where)
    custom_id = obj.get(id_field)
    if "inputs" not in obj:
        return invalid_row(index, f"line {line}: no 'inputs' field", custom_id=custom_id, **where)
    try:
        tensors = coerce_tensors(obj["inputs"], dtype)
    except (ValidationError, ValueError, TypeError) as exc:
        return invalid_row(index, f"line {line}: {exc}", custom_id=custom_id, **where)
    return Row(index, tensors, custom_id, **where)


def _next_wanted(wanted: Iterator[int] | None, target: int | None, index: int) -> int | None:
    while target is not None and target < index:
        target = next(wanted, None) if wanted is not None else None
    return target


class JsonlSource:
    """One ``{"custom_id": ..., "inputs": ...}`` object per line; blank lines are not rows.

    A line over ``max_line_bytes`` is a row (an invalid one) whatever it holds: it is
    never read whole, so whether it was blank is not known, and counting it keeps row
    numbers the same in every pass and every resume.
    """

    def __init__(self, path: Path, dtype: str, id_field: str,
                 max_line_bytes: int = MAX_LINE_BYTES,
                 opener: Callable[[], IO[bytes]] | None = None) -> None:
        """``opener``: how to open a part that is not a local file (S3); its total is
        then unknown, since counting lines would download the part twice."""
        self.path, self.dtype, self.id_field = path, dtype, id_field
        self.max_line_bytes = max_line_bytes
        self._open: Callable[[], IO[bytes]] = opener or (lambda: path.open("rb"))
        self.total: int | None = count_lines(path) if opener is None else None
        self.warnings: tuple[str, ...] = ()

    def rows(self, start: Position, wanted: Iterator[int] | None = None) -> Iterator[Row]:
        offset, line, index = start.in_offset, start.in_line, start.rows
        target = next(wanted, None) if wanted is not None else None
        with self._open() as f:
            f.seek(offset)
            while True:
                raw, consumed, length = read_line(f, self.max_line_bytes)
                if not consumed:
                    return
                offset += consumed
                line += 1
                if raw is not None and not raw.strip():
                    continue
                if wanted is not None:
                    target = _next_wanted(wanted, target, index)
                    if target is None:
                        return
                    if target != index:
                        index += 1
                        continue
                if raw is None:
                    yield invalid_row(index, f"line {line} is {length:,} bytes, over the "
                                      f"{self.max_line_bytes:,}-byte limit (--max-line-bytes)",
                                      line=line, end_offset=offset, end_line=line)
                else:
                    yield parse_jsonl(raw, index, line, offset, self.id_field, self.dtype)
                index += 1


class NpySource:
    """A ``.npy`` array whose first axis is the rows, read through a memory map."""

    def __init__(self, path: Path, dtype: str) -> None:
        try:
            self._array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise InputFormatError(f"{path}: not a readable .npy array: {exc}") from exc
        if self._array.ndim == 0:
            raise InputFormatError(f"{path}: a 0-d array has no rows")
        self.dtype = dtype
        self.total: int | None = int(self._array.shape[0])
        self.warnings: tuple[str, ...] = ()

    def rows(self, start: Position, wanted: Iterator[int] | None = None) -> Iterator[Row]:
        total = int(self._array.shape[0])
        if wanted is not None:
            for index in wanted:
                if index >= total:
                    return
                yield self._row(index, np.array(self._array[index]))
            return
        for lo in range(start.rows, total, NPY_BLOCK):
            block = np.array(self._array[lo:lo + NPY_BLOCK])  # one read, then views per row
            for k in range(block.shape[0]):
                yield self._row(lo + k, block[k])

    def _row(self, index: int, value: Any) -> Row:
        try:
            return Row(index, coerce_tensors(value, self.dtype))
        except (ValidationError, ValueError, TypeError) as exc:
            return invalid_row(index, f"row {index}: {exc}")


def open_source(spec: JobSpec) -> Source:
    if spec.format == "jsonl":
        return JsonlSource(spec.input, spec.dtype, spec.id_column, spec.max_line_bytes)
    if spec.format == "npy":
        return NpySource(spec.input, spec.dtype)
    from batchfleet.producers.bulk.source_parquet import ParquetSource

    return ParquetSource(spec)
