"""``rq cron`` configuration (RQ 3.0): the nightly bulk scoring job.

Run the scheduler and an RQ worker for its queue, from the repository root or
anywhere ``producers`` is importable (the batchfleet image):

    rq cron infra/cron/bulk_nightly.py --url redis://redis:6379/0
    rq worker batchfleet-bulk --url redis://redis:6379/0

The scheduler enqueues ``producers.bulk.scheduled.run_nightly`` at
``BATCHFLEET_BULK_CRON`` (default 02:00 every day, in the scheduler's local
time); the RQ worker runs it. The bulk job's ID is ``<prefix>-YYYYMMDD`` of the
day it was enqueued, so running it again that day resumes it. See docs/bulk.md.

This file is an entry point, like the CLI, so it is where the settings are read
from the environment (once, when the scheduler loads it):

| variable | meaning |
| --- | --- |
| BATCHFLEET_BROKER | broker URL (required) |
| BATCHFLEET_RESULTS | result store URL (required with Kafka) |
| BATCHFLEET_NAMESPACE | key prefix, default bf |
| BATCHFLEET_BULK_MODEL | model to score with (required) |
| BATCHFLEET_BULK_INPUT | input file; may contain {date} (YYYY-MM-DD) (required) |
| BATCHFLEET_BULK_OUTPUT | output file; may contain {date} (required) |
| BATCHFLEET_BULK_ERRORS | errors file; default beside the output |
| BATCHFLEET_BULK_CRON | cron expression, default "0 2 * * *" |
| BATCHFLEET_BULK_QUEUE | RQ queue, default batchfleet-bulk |
| BATCHFLEET_BULK_JOB_PREFIX | job ID prefix, default nightly |
| BATCHFLEET_BULK_MAX_FAILURE_RATE | above it the RQ job fails, default 0 |
| BATCHFLEET_BULK_WINDOW | rows in flight, default 4096 |
| BATCHFLEET_BULK_TIMEOUT_S | RQ job timeout, default 21600 (6 h) |
"""

from __future__ import annotations

import os

from rq import cron

from batchfleet.producers.bulk.scheduled import run_nightly


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} must be set for the nightly bulk job (see {__file__})")
    return value


cron.register(
    run_nightly,
    queue_name=os.environ.get("BATCHFLEET_BULK_QUEUE", "batchfleet-bulk"),
    cron=os.environ.get("BATCHFLEET_BULK_CRON", "0 2 * * *"),
    kwargs={
        "model": _required("BATCHFLEET_BULK_MODEL"),
        "input": _required("BATCHFLEET_BULK_INPUT"),
        "output": _required("BATCHFLEET_BULK_OUTPUT"),
        "errors": os.environ.get("BATCHFLEET_BULK_ERRORS") or None,
        "broker": _required("BATCHFLEET_BROKER"),
        "results": os.environ.get("BATCHFLEET_RESULTS") or None,
        "namespace": os.environ.get("BATCHFLEET_NAMESPACE", "bf"),
        "job_prefix": os.environ.get("BATCHFLEET_BULK_JOB_PREFIX", "nightly"),
        "max_failure_rate": float(os.environ.get("BATCHFLEET_BULK_MAX_FAILURE_RATE", "0")),
        "window": int(os.environ.get("BATCHFLEET_BULK_WINDOW", "4096")),
    },
    job_timeout=int(os.environ.get("BATCHFLEET_BULK_TIMEOUT_S", str(6 * 3600))),
    name="batchfleet-bulk-nightly",
)
