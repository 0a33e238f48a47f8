"""Showing a running job: a rich progress bar on a TTY, structured log lines elsewhere.

The job only calls ``start``/``update``/``stop``; which reporter it gets is
decided once, at the entry point (is stderr a terminal?), so the job logic
never branches on where its output goes.
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

log = structlog.get_logger("batchfleet.bulk")


class ProgressReporter(Protocol):
    def start(self, job_id: str, total: int | None, done: int, failed: int) -> None: ...

    def update(self, done: int, failed: int) -> None: ...

    def waiting(self, reason: str | None) -> None:
        """Show that the job is waiting (``reason``), or no longer (None)."""

    def stop(self) -> None: ...


class NoProgress:
    def start(self, job_id: str, total: int | None, done: int, failed: int) -> None:
        pass

    def update(self, done: int, failed: int) -> None:
        pass

    def waiting(self, reason: str | None) -> None:
        pass

    def stop(self) -> None:
        pass


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("-- rows/s" if speed is None else f"{speed:,.0f} rows/s", style="cyan")


class BarProgress:
    """Rows done, rate, ETA and failures, redrawn in place (stderr, so stdout stays clean)."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TaskProgressColumn(), _RateColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            TextColumn("[red]{task.fields[failed]:,} failed"),
            console=console or Console(stderr=True), speed_estimate_period=15.0)
        self._task: TaskID | None = None
        self._job_id = ""

    def start(self, job_id: str, total: int | None, done: int, failed: int) -> None:
        self._job_id = job_id
        self._progress.start()
        self._task = self._progress.add_task(job_id, total=total, completed=done, failed=failed)

    def waiting(self, reason: str | None) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=self._job_id if reason is None
                                  else f"{self._job_id} [yellow]({reason})[/]")

    def update(self, done: int, failed: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=done, failed=failed)

    def stop(self) -> None:
        self._progress.stop()


class LogProgress:
    """One ``bulk progress`` log line every ``every_s`` seconds: for cron, CI and Kubernetes."""

    def __init__(self, every_s: float = 10.0) -> None:
        self._every_s = every_s
        self._job_id = ""
        self._total: int | None = None
        self._start_done = 0
        self._started = self._last = 0.0
        self._done = self._failed = 0
        self._waiting = False

    def start(self, job_id: str, total: int | None, done: int, failed: int) -> None:
        self._job_id, self._total, self._start_done = job_id, total, done
        self._done, self._failed = done, failed
        self._started = self._last = time.monotonic()
        log.info("bulk job started", job_id=job_id, total=total, resumed_from=done)

    def update(self, done: int, failed: int) -> None:
        self._done, self._failed = done, failed
        if not self._waiting and time.monotonic() - self._last >= self._every_s:
            self._emit()

    def waiting(self, reason: str | None) -> None:
        """No progress lines while waiting: the watch said why, once (``bulk.watch``)."""
        self._waiting = reason is not None
        self._last = time.monotonic()

    def _emit(self) -> None:
        self._last = now = time.monotonic()
        rate = (self._done - self._start_done) / max(now - self._started, 1e-9)
        left = None if self._total is None else max(0, self._total - self._done)
        log.info("bulk progress", job_id=self._job_id, rows_done=self._done, total=self._total,
                 failed=self._failed, rate_rps=round(rate, 1),
                 eta_s=None if left is None or rate <= 0 else round(left / rate, 1))

    def stop(self) -> None:
        self._emit()
