"""What a bulk job is: its ID, model, files and knobs, validated once at the entry point.

The job ID names the job in Redis and is the stem of every request ID the job
submits (``{job_id}:{row}``), which is what makes a re-run with the same ID a
resume: the same row always maps to the same request, so the result store
dedupes it. The spec's identity is stored with the job, and a resume with a
different model, input or output is refused rather than silently mixed.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from batchfleet.producers.bulk.errors import InputFormatError
from batchfleet.schemas.envelopes import check_version_label
from batchfleet.schemas.errors import ConfigError, ValidationError
from batchfleet.schemas.names import check_model_name
from batchfleet.schemas.tensors import DTYPES

#: A job ID is a request-ID prefix: the request ID alphabet minus ':' (the row separator).
_JOB_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,79}$")

#: Default ``--max-line-bytes``: a longer JSONL line is skipped without being held in
#: memory and becomes that row's ``invalid_row``. Parsing a line costs several times its
#: size, so this limit, not the file's size, is what bounds the job's memory.
MAX_LINE_BYTES: Final = 16 * 1024 * 1024

#: Format family -> the file suffixes that belong to it.
SUFFIXES: Final = {
    "jsonl": (".jsonl", ".ndjson"),
    "parquet": (".parquet", ".pq"),
    "npy": (".npy",),
}


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ConfigError(
            f"job ID {job_id!r} must be 1-80 characters of letters, digits or ._@- "
            "(starting with a letter or digit)"
        )
    return job_id


def check_options(job_id: str, model: str, dtype: str, max_line_bytes: int,
                  version: str | None) -> None:
    """The checks every job's options get, whether it reads one file or a dataset."""
    check_job_id(job_id)
    try:
        check_model_name(model)
        check_version_label(version)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not 'auto' or one of {sorted(DTYPES)}")
    if max_line_bytes < 1:
        raise ConfigError(f"--max-line-bytes must be at least 1, not {max_line_bytes}")


def new_job_id() -> str:
    """A fresh, sortable job ID for runs that did not name one."""
    return f"bulk-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"


def request_id_for(job_id: str, row: int, retry_round: int = 0, epoch: int = 0) -> str:
    """The request ID of one row: deterministic, so a resumed job re-derives the same IDs.

    A ``--retry-failed`` round gets its own suffix: the first attempt's ``failed``
    result is terminal and a duplicate submit would (rightly) never run it again.
    For the same reason a ``--restart`` starts a new *epoch* with its own suffix,
    so scoring from scratch really computes every row again.
    """
    rid = f"{job_id}:{row}" if epoch == 0 else f"{job_id}:{row}:e{epoch}"
    return rid if retry_round == 0 else f"{rid}:r{retry_round}"


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower()
    for family, suffixes in SUFFIXES.items():
        if suffix in suffixes:
            return family
    known = ", ".join(s for group in SUFFIXES.values() for s in group)
    raise InputFormatError(f"{path}: cannot tell the format from {suffix!r}; use one of {known}")


def default_errors_path(output: Path, job_id: str) -> Path:
    """``scores.parquet`` -> ``scores.JOB_ID.errors.jsonl``: JSONL for every format, and one
    file per job, so two jobs whose outputs share a stem never truncate each other's."""
    return output.with_name(f"{output.stem}.{job_id}.errors.jsonl")


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_id: str
    model: str
    input: Path
    output: Path
    errors: Path
    format: str
    #: "auto" sends floating inputs as float32 (as the SDK does for lists); or a wire dtype.
    dtype: str = "auto"
    #: Parquet: the column holding one tensor (a list) per row...
    input_column: str | None = None
    #: ...or the numeric columns stacked into a row vector (default: every numeric column).
    feature_columns: tuple[str, ...] = ()
    #: Parquet and JSONL: the row's own identifier, copied to the output.
    id_column: str = "custom_id"
    #: JSONL: a longer line is an ``invalid_row``, skipped unread. Not part of the
    #: identity: a line is one row whatever the limit, so a retry may raise it.
    max_line_bytes: int = MAX_LINE_BYTES
    #: Pin every row to one version label (``bulk run --version``); None: the policy routes.
    version: str | None = None

    @classmethod
    def create(
        cls, job_id: str, model: str, input: Path, output: Path, errors: Path | None = None,
        *, dtype: str = "auto", input_column: str | None = None,
        feature_columns: tuple[str, ...] = (), id_column: str = "custom_id",
        max_line_bytes: int = MAX_LINE_BYTES, version: str | None = None,
    ) -> JobSpec:
        check_options(job_id, model, dtype, max_line_bytes, version)
        if not input.is_file():
            raise InputFormatError(f"input {input} does not exist or is not a file")
        family = detect_format(input)
        if detect_format(output) != family:
            raise ConfigError(f"output {output} must be in the input's format family "
                              f"({family}: {', '.join(SUFFIXES[family])})")
        errors = errors or default_errors_path(output, job_id)
        paths = {p.resolve() for p in (input, output, errors)}
        if len(paths) != 3:
            raise ConfigError("input, output and errors must be three different files")
        return cls(job_id, model, input.resolve(), output.resolve(), errors.resolve(), family,
                   dtype, input_column, tuple(feature_columns), id_column, max_line_bytes,
                   version)

    def resuming(self, stored: Mapping[str, Any]) -> JobSpec:
        """This spec, keeping the errors file of a job started when the default was
        ``OUTPUT-stem.errors.jsonl`` (before one file per job ID), so it still resumes."""
        legacy = str(self.output.with_name(f"{self.output.stem}.errors.jsonl"))
        if (stored.get("errors") == legacy
                and self.errors == default_errors_path(self.output, self.job_id)):
            return replace(self, errors=Path(legacy))
        return self

    def identity(self) -> dict[str, Any]:
        """What must not change between a job's runs (the input file included); stored as JSON."""
        stat = self.input.stat()
        return {"model": self.model, "input": str(self.input), "output": str(self.output),
                "input_size": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
                "errors": str(self.errors), "format": self.format, "dtype": self.dtype,
                "input_column": self.input_column, "feature_columns": list(self.feature_columns),
                "id_column": self.id_column,
                # only when pinned, so jobs started before pinning existed still resume
                **({} if self.version is None else {"version": self.version})}


@dataclass(frozen=True, slots=True)
class Tuning:
    """How hard a job pushes. Defaults suit one CPU worker; raise ``window`` for a big fleet."""

    #: Rows submitted but not yet written: bounds the bulk backlog and the reorder buffer.
    window: int = 4096
    #: Rows per submit round trip.
    chunk: int = 512
    #: How often progress is made durable (output flushed, checkpoint written to Redis).
    checkpoint_s: float = 1.0
    #: A chunk with no result this long is published again (a lost message, not a slow fleet).
    stall_s: float = 600.0
    #: Parquet: rows per part file (a part is the unit of a durable checkpoint)...
    part_rows: int = 65_536
    #: ...or seconds, whichever comes first.
    part_s: float = 30.0
    #: Stop when this many first rows of a job all fail the same way (0: never)...
    early_stop_rows: int = 100
    #: ...or when more than this fraction of them fail (1.0: only the same-way check).
    early_stop_rate: float = 0.5
    #: ``never``: rows fail closed (``unavailable``) rather than take a model's fallback
    #: answer (docs/degradation.md). A choice of this run, not of the job's identity.
    degrade: str = "allow"

    def validated(self) -> Tuning:
        if self.window < 1 or self.chunk < 1 or self.part_rows < 1:
            raise ConfigError("window, chunk and part_rows must be at least 1")
        if self.early_stop_rows < 0:
            raise ConfigError("early_stop_rows must be 0 (off) or more")
        if not 0.0 <= self.early_stop_rate <= 1.0:
            raise ConfigError("early_stop_rate must be between 0 and 1 (1: off)")
        if min(self.checkpoint_s, self.stall_s, self.part_s) <= 0:
            raise ConfigError("checkpoint_s, stall_s and part_s must be positive")
        if self.degrade not in ("allow", "never"):
            raise ConfigError(f"--degrade must be allow or never, not {self.degrade!r}")
        return self

    @property
    def chunk_rows(self) -> int:
        return min(self.chunk, self.window)
