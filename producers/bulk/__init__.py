"""Bulk scoring: files in, files out, on the same fleet as interactive traffic.

``run_job`` streams a JSONL, Parquet or ``.npy`` file through the fleet on the
low-priority ``bulk`` lane, with a bounded in-flight window, and writes the
results in input order with a durable checkpoint in Redis, so a killed job
resumes where it stopped. See ``docs/bulk.md``.
"""

from producers.bulk.errors import (
    BulkError,
    FailureRateExceededError,
    InputFormatError,
    JobConflictError,
    LeaseLostError,
)
from producers.bulk.job import Endpoints, run_job
from producers.bulk.progress import BarProgress, LogProgress, NoProgress, ProgressReporter
from producers.bulk.report import JobReport, exit_code, summary_table
from producers.bulk.spec import JobSpec, Tuning, new_job_id, request_id_for
from producers.bulk.state import JobRecord, list_jobs, load_job, request_cancel

__all__ = [
    "BarProgress",
    "BulkError",
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
