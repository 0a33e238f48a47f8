"""The nightly bulk job as a plain function, for ``rq cron`` to enqueue (``infra/cron/``).

The job ID is the schedule's date (``nightly-20250101``): an RQ job that is
re-enqueued, or run again by hand after a crash, the same day resumes the same
bulk job instead of starting over. Paths may contain ``{date}`` (YYYY-MM-DD)
and ``{job_id}``. The function raises when the failure rate is over the limit,
so RQ records the run as failed.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from batchfleet.producers.bulk.errors import FailureRateExceededError
from batchfleet.producers.bulk.job import Endpoints, run_job
from batchfleet.producers.bulk.progress import LogProgress
from batchfleet.producers.bulk.report import EXIT_OK, exit_code
from batchfleet.producers.bulk.spec import JobSpec, Tuning
from batchfleet.schemas.names import DEFAULT_NAMESPACE


def scheduled_day() -> date:
    """The day the RQ job was enqueued (the schedule's day), or today outside RQ."""
    from rq import get_current_job

    job = get_current_job()
    when = job.enqueued_at if job is not None and job.enqueued_at is not None else None
    return (when or datetime.now(UTC)).date()


def run_nightly(
    *, model: str, input: str, output: str, broker: str, results: str | None = None,
    errors: str | None = None, namespace: str = DEFAULT_NAMESPACE, job_prefix: str = "nightly",
    max_failure_rate: float = 0.0, window: int = 4096, dtype: str = "auto",
    day: date | None = None,
) -> dict[str, Any]:
    """Run (or resume) the day's bulk job; returns its report, which RQ keeps as the result."""
    day = day or scheduled_day()
    job_id = f"{job_prefix}-{day:%Y%m%d}"
    fill = {"date": f"{day:%Y-%m-%d}", "job_id": job_id}
    spec = JobSpec.create(
        job_id, model, Path(input.format(**fill)), Path(output.format(**fill)),
        Path(errors.format(**fill)) if errors else None, dtype=dtype)
    report = asyncio.run(run_job(spec, Endpoints(broker, results, namespace),
                                 tuning=Tuning(window=window), progress=LogProgress()))
    if exit_code(report, max_failure_rate) != EXIT_OK:
        raise FailureRateExceededError(
            f"bulk job {job_id} ended {report.status} with {report.failed:,} of "
            f"{report.rows:,} rows failed ({report.failure_rate:.2%}; max "
            f"{max_failure_rate:.2%}); see {report.errors}")
    return report.to_dict()
