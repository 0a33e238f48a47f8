"""Bulk-job errors: a subtree of the project's one hierarchy (``BatchfleetError``).

They live beside the bulk job because ``schemas/errors.py`` is owned by the
wire contract; each maps to a distinct CLI exit code, so callers (cron, CI)
can tell "fix your input" from "someone else is running this job".
"""

from __future__ import annotations

from batchfleet.schemas.errors import BatchfleetError


class BulkError(BatchfleetError):
    """A bulk scoring job cannot start or continue."""

    wire_type = "bulk_error"


class InputFormatError(BulkError):
    """The input file as a whole is unusable (unknown format, missing column, unreadable).

    A single malformed *row* is not this error: it goes to the errors file and the job goes on.
    """

    wire_type = "bulk_input_error"


class JobConflictError(BulkError):
    """The job ID is taken: by a live run, or by a job with a different input, model or output."""

    wire_type = "bulk_job_conflict"


class LeaseLostError(BulkError):
    """Another process took this job over (our lease expired); we must stop writing at once."""

    wire_type = "bulk_lease_lost"


class FailureRateExceededError(BulkError):
    """A job finished with more failed rows than allowed (so a scheduler marks it failed)."""

    wire_type = "bulk_failure_rate"


class OutputMissingError(BulkError):
    """A file the checkpoint vouches for is gone or shorter: resuming would silently lose rows.

    The fix is the operator's (restore the file, or ``--restart``), so the message says both.
    """

    wire_type = "bulk_output_missing"


class NotStartedError(BulkError):
    """The run failed before it scored a row (the fleet unreachable, the model unknown)
    and the job has no saved progress: there is nothing to resume, so none is offered."""

    wire_type = "bulk_not_started"


class EarlyStopError(BulkError):
    """The first rows of a job all failed the same way: the input or options are wrong.

    Scoring the rest would only fill the errors file, so the job stops and says what to fix.
    """

    wire_type = "bulk_early_stop"
