"""A dataset job: many Parquet or JSONL *parts* in, one output part per input part.

``--input`` names the parts: an ``s3://bucket/prefix``, a local directory
(every part under it, recursively), or a glob (``data/*.parquet``,
``s3://bucket/day=*/part-*.jsonl``). Parts are sorted by their path under
that root, and a part's place in that order is its *index*: it names the
part's requests (``JOB.p000003:ROW``), so the same part always maps to the
same request IDs however the job is split, and a resume or a second shard
never computes a row twice.

``--shard K/N`` splits the parts between N runners: runner K takes the parts
whose index is ``K-1`` modulo N (deterministic, disjoint, covering). Each
runner is its own job record (``JOB.shardK-of-N``) with its own lease and
checkpoint, so each resumes on its own; ``bulk status JOB`` adds them up.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from batchfleet.producers.bulk.errors import InputFormatError
from batchfleet.producers.bulk.spec import (
    MAX_LINE_BYTES,
    SUFFIXES,
    JobSpec,
    check_job_id,
    check_options,
)
from batchfleet.producers.bulk.storage import (
    FoundFile,
    Location,
    S3Options,
    exists,
    has_glob,
    is_remote,
    list_files,
    locate,
)
from batchfleet.schemas.errors import ConfigError

#: Formats a dataset's parts may be in (``.npy`` outputs are memory maps: single files only).
DATASET_FORMATS: Final = ("jsonl", "parquet")
_SHARD: Final = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
#: Under the output: each part's failed rows, as ``_errors/PART.errors.jsonl``.
ERRORS_DIR: Final = "_errors"
#: Default staging folders' names: under a local output, and in the temp folder (S3).
DEFAULT_STAGING: Final = (".batchfleet-staging", "batchfleet-bulk")
#: Under the output: uploads in progress (S3), copied to their final keys when complete.
TMP_PREFIX: Final = "_tmp"


def is_dataset(input: str) -> bool:
    """Whether ``--input`` names parts (S3, a directory, a glob) rather than one file."""
    return is_remote(input) or has_glob(input) or Path(input).expanduser().is_dir()


def check_dataset_flags(input: str, errors: Path | None, retry_failed: bool) -> None:
    """What a dataset job refuses that a single file takes, each with the way out."""
    if not is_dataset(input):
        raise ConfigError(f"an s3:// output takes a dataset input (a directory, a glob or an "
                          f"s3:// prefix); {input} is one file")
    if errors is not None:
        raise ConfigError("--errors names one file; a dataset's failed rows go to "
                          "OUTPUT/_errors/PART.errors.jsonl")
    if retry_failed:
        raise ConfigError("--retry-failed works on single files; for a dataset, run the "
                          "job again with --restart")


@dataclass(frozen=True, slots=True)
class Shard:
    number: int = 1
    of: int = 1

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        if text is None:
            return cls()
        match = _SHARD.match(text)
        if match is None or not 1 <= int(match[1]) <= int(match[2]):
            raise ConfigError(f"--shard {text!r} must be K/N with 1 <= K <= N (e.g. 1/4)")
        return cls(int(match[1]), int(match[2]))

    def takes(self, index: int) -> bool:
        return index % self.of == self.number - 1

    def __str__(self) -> str:
        return f"{self.number}/{self.of}"


def shard_record_id(job_id: str, shard: Shard) -> str:
    """The job record one runner owns: the job ID itself, or ``JOB.shardK-of-N``."""
    if shard.of == 1:
        return job_id
    record = f"{job_id}.shard{shard.number}-of-{shard.of}"
    try:
        return check_job_id(record)
    except ConfigError:
        raise ConfigError(f"job ID {job_id!r} is too long to shard: keep it under "
                          f"{80 - len(record) + len(job_id)} characters") from None


def _family(name: str) -> str | None:
    suffix = PurePosixPath(name).suffix.lower()
    return next((f for f, suffixes in SUFFIXES.items() if suffix in suffixes), None)


def _split_glob(location: Location) -> tuple[Location, str | None]:
    """``root/a*/b.parquet`` -> (``root``, ``a*/b.parquet``): list the root, match the rest."""
    parts = location.path.split("/")
    first = next((i for i, p in enumerate(parts) if has_glob(p)), None)
    if first is None:
        return location, None
    root_path = "/".join(parts[:first]) or "/"
    root_url = location.url[: len(location.url) - len("/".join(parts[first:])) - 1]
    return Location(location.fs, root_path, root_url), "/".join(parts[first:])


def discover(input: str, s3: S3Options) -> tuple[Location, list[FoundFile]]:
    """The dataset's root and its parts, sorted; one clear error when there are none."""
    root, pattern = _split_glob(locate(input, s3))
    files = list_files(root, pattern)
    # s3://bucket/one-object.parquet: a dataset of one part
    if not files and pattern is None and root.remote and _family(root.path) and exists(root):
        parent, _, name = root.path.rpartition("/")
        root = Location(root.fs, parent, root.url[: -len(name) - 1])
        files = list_files(root, name)
    parts = [f for f in files if _family(f.relative) is not None]
    what = f"{root.url}" + (f" matching {pattern!r}" if pattern else "")
    if not parts:
        skipped = (f" ({len(files)} other file{'s' if len(files) > 1 else ''}; parts end in "
                   ".parquet, .pq, .jsonl or .ndjson)") if files else ""
        raise InputFormatError(f"no Parquet or JSONL parts found in {what}{skipped}")
    families = {_family(p.relative) for p in parts}
    if families - set(DATASET_FORMATS):
        raise InputFormatError(f"{what}: .npy parts are not supported in a dataset; "
                               "score .npy files one at a time")
    if len(families) > 1:
        raise InputFormatError(f"{what} mixes Parquet and JSONL parts; a job reads one format")
    return root, parts


@dataclass(frozen=True, slots=True)
class Part:
    #: Place in the sorted listing of the whole dataset (names its requests).
    index: int
    file: FoundFile

    @property
    def name(self) -> str:
        return self.file.relative


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    job_id: str
    model: str
    input: Location
    output: Location
    format: str
    parts: tuple[Part, ...]
    shard: Shard
    #: Where this runner's parts are written before they are published.
    staging: Path
    options: dict[str, Any]

    @classmethod
    def create(
        cls, job_id: str, model: str, input: str, output: str, *, s3: S3Options,
        shard: Shard = Shard(), staging: Path | None = None, dtype: str = "auto",
        input_column: str | None = None, feature_columns: tuple[str, ...] = (),
        id_column: str = "custom_id", max_line_bytes: int = MAX_LINE_BYTES,
        version: str | None = None,
    ) -> DatasetSpec:
        check_options(job_id, model, dtype, max_line_bytes, version)
        shard_record_id(job_id, shard)
        root, files = discover(input, s3)
        out = locate(output, s3)
        if not out.remote and Path(out.path).is_file():
            raise ConfigError(f"output {out.url} is a file; a dataset's output is a directory "
                              "or an s3:// prefix (one part per input part)")
        _check_apart(root, out)
        if staging is None:
            staging = (Path(tempfile.gettempdir()) / DEFAULT_STAGING[1] if out.remote
                       else Path(out.path) / DEFAULT_STAGING[0])
        staging = staging / shard_record_id(job_id, shard)  # shards may share the folder
        options = {"dtype": dtype, "input_column": input_column,
                   "feature_columns": tuple(feature_columns), "id_column": id_column,
                   "max_line_bytes": max_line_bytes, "version": version}
        family = _family(files[0].relative)
        assert family is not None
        return cls(job_id, model, root, out, family,
                   tuple(Part(i, f) for i, f in enumerate(files)), shard,
                   staging.absolute(), options)

    @property
    def record_id(self) -> str:
        return shard_record_id(self.job_id, self.shard)

    @property
    def mine(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if self.shard.takes(p.index))

    @property
    def version(self) -> str | None:
        version: str | None = self.options["version"]
        return version

    def part_stem(self, part: Part) -> str:
        """The job ID its requests are named after: ``JOB.p000003``."""
        return f"{self.job_id}.p{part.index:06d}"

    def part_spec(self, part: Part) -> JobSpec:
        """The part as a single-file job, its output and errors in the staging folder.

        For a local part ``input`` is the file itself; for a remote one it only
        names it (the source reads through the filesystem).
        """
        directory = self.staging / f"{part.index:06d}"
        suffix = PurePosixPath(part.name).suffix
        source = Path(part.file.location.path) if not self.input.remote else Path(part.name)
        o = self.options
        return JobSpec(self.part_stem(part), self.model, source, directory / f"out{suffix}",
                       directory / "errors.jsonl", self.format, o["dtype"], o["input_column"],
                       o["feature_columns"], o["id_column"], o["max_line_bytes"], o["version"])

    def output_of(self, part: Part) -> Location:
        return self.output.child(part.name)

    def errors_of(self, part: Part) -> Location:
        return self.output.child(f"{ERRORS_DIR}/{part.name}.errors.jsonl")

    def tmp_of(self, part: Part, final: Location) -> Location:
        """The temporary key an S3 upload goes to before it is copied to ``final``.

        Flat, beside the parts (``OUTPUT/_tmp.RECORD.INDEX.NAME``), never in a
        folder of its own: deleting the last file of an S3 "folder" makes Arrow
        leave an empty folder marker behind.
        """
        name = final.path.rsplit("/", 1)[-1]
        return self.output.child(f"{TMP_PREFIX}.{self.record_id}.{part.index:06d}.{name}")

    def identity(self) -> dict[str, Any]:
        """What must not change between a runner's runs: the whole listing included
        (a part added or rewritten would move parts between shards)."""
        listing = "\n".join(f"{p.name}\t{p.file.size}\t{p.file.mtime_ns}" for p in self.parts)
        o = self.options
        return {"model": self.model, "input": self.input.url, "output": self.output.url,
                "format": self.format, "shard": str(self.shard), "parts": len(self.parts),
                "listing": hashlib.sha256(listing.encode()).hexdigest()[:32],
                "errors": self.output.child(ERRORS_DIR).url, "dtype": o["dtype"],
                "input_column": o["input_column"], "feature_columns": list(o["feature_columns"]),
                "id_column": o["id_column"],
                **({} if o["version"] is None else {"version": o["version"]})}

    def resuming(self, stored: dict[str, Any]) -> DatasetSpec:
        return self


def _check_apart(root: Location, out: Location) -> None:
    """The output must not overlap the input: its parts would be read as input next time."""
    if root.remote != out.remote:
        return
    a, b = root.path.rstrip("/") + "/", out.path.rstrip("/") + "/"
    if a.startswith(b) or b.startswith(a):
        raise ConfigError(f"output {out.url} overlaps input {root.url}: use a separate "
                          "directory or prefix")
