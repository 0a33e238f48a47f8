"""Before a run: are the files the job's checkpoint vouches for still on disk?

A resume truncates the output back to the checkpoint and appends to it; a
finished job only reports. Both trust that the rows the checkpoint counts are
on disk. Had a file been deleted or cut short, trusting it would lose those
rows without a word (or report a finished job with no output), so the run
stops first with one message that names both ways out: restore the file, or
``--restart``.
"""

from __future__ import annotations

from pathlib import Path

from batchfleet.producers.bulk.errors import OutputMissingError
from batchfleet.producers.bulk.rows import Position
from batchfleet.producers.bulk.sink_npy import status_path
from batchfleet.producers.bulk.spec import JobSpec


def missing_message(path: Path, size: int | None, need: int, rows: int) -> str:
    """One coherent line for a file that is gone (``size`` None) or shorter than ``need``."""
    fix = f"run again with --restart to score from scratch, or restore {path}"
    if size is None:
        return f"output {path} is missing but the job state says {rows:,} rows are done: {fix}"
    return (f"output {path} has {size:,} bytes but the job state says {rows:,} rows "
            f"({need:,} bytes) are done: {fix}")


def _expected(spec: JobSpec, pos: Position, finished: bool, errors: bool
              ) -> list[tuple[Path, int]]:
    """(file, at least this many bytes) for each file the checkpoint counts on."""
    need: list[tuple[Path, int]] = []
    if spec.format == "jsonl":
        if pos.out_offset or finished:
            need.append((spec.output, pos.out_offset))
    elif spec.format == "npy":
        if pos.rows or finished:
            need.append((status_path(spec.output), 0))
        if pos.succeeded:  # the outputs array is created by the first success
            need.append((spec.output, 0))
    elif finished:
        need.append((spec.output, 0))
    elif pos.parts:
        from batchfleet.producers.bulk.sink_parquet import parts_dir

        directory = parts_dir(spec)
        if directory.exists() or not spec.output.exists():  # else: merged, then crashed
            need += [(directory / f"part-{i:06d}.parquet", 0) for i in range(pos.parts)]
    if pos.err_offset and errors:
        need.append((spec.errors, pos.err_offset))
    return need


def check_files(spec: JobSpec, pos: Position, finished: bool, errors: bool = True) -> None:
    """Raise ``OutputMissingError`` when a file the checkpoint counts on is gone or short.

    ``errors``: whether this run needs the errors file (a resume appends to it, a
    retry reads it; a finished job that is only reported does not).
    """
    for path, size in _expected(spec, pos, finished, errors):
        try:
            have = path.stat().st_size
        except FileNotFoundError:
            raise OutputMissingError(missing_message(path, None, size, pos.rows)) from None
        if have < size:
            raise OutputMissingError(missing_message(path, have, size, pos.rows))
