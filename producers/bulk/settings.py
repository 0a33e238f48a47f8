"""``bulk run``'s plain-value options, each declared once with its default and help.

``cli_bulk.py`` generates the command's typer options (and ``--print-config``) from these
fields, as the worker and the gateway do. Most are per-job values and read no variable
(``no_env``); the three that read one keep their ``BATCHFLEET_BULK_*`` names. The model,
the input, the output (with its deprecated ``-o/--output``), the connection and logging
options stay hand-written in the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchfleet.schemas.settings import opt

_ENV = "BATCHFLEET_BULK_"


@dataclass(frozen=True, slots=True)
class BulkRunSettings:
    errors: str | None = field(default=None, metadata=opt(
        "Failed rows (JSONL). Default: OUTPUT's stem + .JOB_ID.errors.jsonl "
        "(a dataset: OUTPUT/_errors/PART.errors.jsonl).", no_env=True, metavar="PATH"))
    shard: str | None = field(default=None, metadata=opt(
        "Dataset: run only shard K of N (K/N): the parts whose index is K-1 mod N. "
        "Each shard resumes on its own; `bulk status JOB` adds them up.", no_env=True))
    s3_endpoint: str | None = field(default=None, metadata=opt(
        "S3-compatible endpoint, http(s)://host:port. Default: AWS_ENDPOINT_URL_S3 or "
        "AWS_ENDPOINT_URL; credentials and region from the usual AWS_* variables.",
        no_env=True))
    staging_dir: str | None = field(default=None, metadata=opt(
        "Dataset: where parts are written before they are published. Default: under "
        "the output directory, or the temp directory for S3 outputs.",
        env=_ENV + "STAGING_DIR", metavar="PATH"))
    job_id: str | None = field(default=None, metadata=opt(
        "Run again with the same ID to resume. Default: a new ID (printed).",
        env=_ENV + "JOB_ID"))
    retry_failed: bool = field(default=False, metadata=opt(
        "Run only the failed rows of a finished job again.", no_env=True))
    restart: bool = field(default=False, metadata=opt(
        "Score an existing job from scratch: every row again, its files rewritten.",
        no_env=True))
    max_failure_rate: float = field(default=0.0, metadata=opt(
        "Exit 1 when more than this fraction of rows failed.", no_env=True))
    window: int = field(default=4096, metadata=opt(
        "Rows in flight at most (backpressure).", env=_ENV + "WINDOW"))
    dtype: str = field(default="auto", metadata=opt(
        "auto (floats as float32) or a dtype to cast inputs to.", no_env=True))
    input_column: str | None = field(default=None, metadata=opt(
        "Parquet: the list column holding each row's tensor (default: 'inputs').",
        no_env=True))
    feature_columns: str | None = field(default=None, metadata=opt(
        "Parquet: comma-separated numeric columns stacked into the row vector.", no_env=True))
    id_column: str = field(default="custom_id", metadata=opt(
        "Field or column with the row's own ID, copied to the output.", no_env=True))
    max_line_bytes: int = field(default=16 * 1024 * 1024, metadata=opt(
        "JSONL: a longer line is skipped unread and fails as invalid_row.", no_env=True))
    version: str | None = field(default=None, metadata=opt(
        "Pin every row to this version label (evaluations); default: the rollout policy.",
        no_env=True))
    degrade: str = field(default="allow", metadata=opt(
        "never: rows fail closed (unavailable) where the model's fallback chain would answer "
        "them; allow: take its answers, marked degraded (docs/degradation.md).",
        no_env=True, metavar="allow|never"))
    early_stop_rows: int = field(default=100, metadata=opt(
        "Stop when this many first rows all fail the same way, or more than "
        "--early-stop-rate of them fail (0: never).", no_env=True))
    early_stop_rate: float = field(default=0.5, metadata=opt(
        "Stop when more than this fraction of the first --early-stop-rows rows "
        "failed (1: off).", no_env=True))
    progress: str = field(default="auto", metadata=opt(
        "auto (a bar on a TTY, else log lines), bar, log or none.", no_env=True))
    stall_s: float = field(default=600.0, metadata=opt(
        "Publish rows again when they have no result for this long.", no_env=True))
    part_rows: int = field(default=65_536, metadata=opt(
        "Parquet: rows per durable checkpoint file while writing (the resume "
        "granularity; not a dataset's parts).", no_env=True))
