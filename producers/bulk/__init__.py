"""Bulk scoring: files in, files out, on the same fleet as interactive traffic.

``run_job`` streams a JSONL, Parquet or ``.npy`` file through the fleet on the
low-priority ``bulk`` lane, with a bounded in-flight window, and writes the
results in input order with a durable checkpoint in Redis, so a killed job
resumes where it stopped. See ``docs/bulk.md``.
"""

from batchfleet.producers.bulk.errors import (
    BulkError,
    EarlyStopError,
    FailureRateExceededError,
    InputFormatError,
    JobConflictError,
    LeaseLostError,
    NotStartedError,
    OutputMissingError,
)
from batchfleet.producers.bulk.job import Endpoints, run_job
from batchfleet.producers.bulk.progress import (
    BarProgress,
    LogProgress,
    NoProgress,
    ProgressReporter,
)
from batchfleet.producers.bulk.report import JobReport, exit_code, summary_table
from batchfleet.producers.bulk.spec import (
    MAX_LINE_BYTES,
    JobSpec,
    Tuning,
    new_job_id,
    request_id_for,
)
from batchfleet.producers.bulk.state import JobRecord, list_jobs, load_job, request_cancel

__all__ = [
    "MAX_LINE_BYTES",
    "BarProgress",
    "BulkError",
    "EarlyStopError",
    "Endpoints",
    "FailureRateExceededError",
    "InputFormatError",
    "JobConflictError",
    "JobRecord",
    "JobReport",
    "JobSpec",
    "LeaseLostError",
    "LogProgress",
    "NoProgress",
    "NotStartedError",
    "OutputMissingError",
    "ProgressReporter",
    "Tuning",
    "exit_code",
    "list_jobs",
    "load_job",
    "new_job_id",
    "request_cancel",
    "request_id_for",
    "run_job",
    "summary_table",
]
