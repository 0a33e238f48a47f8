"""The end of a job: its report, the summary table and the exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from rich.table import Table

#: Exit codes of ``batchfleet bulk run`` (2 is a usage or configuration error).
EXIT_OK: Final = 0
EXIT_TOO_MANY_FAILURES: Final = 1
EXIT_CANCELLED: Final = 3
EXIT_CONFLICT: Final = 4


@dataclass(frozen=True, slots=True)
class JobReport:
    job_id: str
    model: str
    #: "finished" (every row has a terminal result) or "cancelled".
    status: str
    input: str
    output: str
    errors: str
    rows: int
    succeeded: int
    failed: int
    #: Rows this run wrote, from which row it resumed, and how long it took.
    rows_this_run: int
    resumed_from: int
    elapsed_s: float
    retry_round: int = 0
    #: Of ``succeeded``, the rows a fallback answered (marked ``degraded`` in the output).
    degraded: int = 0

    @property
    def failure_rate(self) -> float:
        return self.failed / self.rows if self.rows else 0.0

    @property
    def rate_rps(self) -> float:
        return self.rows_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failure_rate": round(self.failure_rate, 6),
                "rate_rps": round(self.rate_rps, 1)}


def exit_code(report: JobReport, max_failure_rate: float) -> int:
    if report.status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_TOO_MANY_FAILURES if report.failure_rate > max_failure_rate else EXIT_OK


def summary_table(report: JobReport, max_failure_rate: float) -> Table:
    table = Table(title=f"bulk job {report.job_id}: {report.status}", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    over = report.failure_rate > max_failure_rate
    rows: list[tuple[str, str]] = [
        ("model", report.model),
        ("input", report.input),
        ("output", report.output),
        ("errors file", report.errors),
        ("rows", f"{report.rows:,}"),
        ("succeeded", f"{report.succeeded:,}"),
        ("failed", f"{report.failed:,}"),
        *([("degraded", f"{report.degraded:,} (of succeeded; a fallback answered)")]
          if report.degraded else []),
        ("failure rate", f"{'[red]' if over else ''}{report.failure_rate:.4%} "
                         f"(max {max_failure_rate:.4%})"),
        ("rows this run", f"{report.rows_this_run:,}"),
        ("resumed from row", f"{report.resumed_from:,}"),
        ("elapsed", f"{report.elapsed_s:,.1f} s"),
        ("rate", f"{report.rate_rps:,.0f} rows/s"),
    ]
    if report.retry_round:
        rows.append(("retry round", str(report.retry_round)))
    for label, value in rows:
        table.add_row(label, value)
    return table
