"""structlog set-up: JSON lines in production, a readable console on a TTY.

Log lines go to the stderr file descriptor from a writer thread, through a
bounded queue. Logging therefore never blocks the event loop (a reader that
stops reading fills the pipe: lines are dropped once the queue is full) and
never raises into whatever was logging: once a write fails (stderr is a pipe
whose reader has gone, as in ``batchfleet worker 2>&1 | head -1``), every
later line is dropped. A signal handler that logs must still stop the worker.
At exit the queue gets a bounded moment to drain, so the last lines still land.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Literal, TextIO

import structlog

from batchfleet.connectors.tracing import add_trace_ids, tracer
from batchfleet.schemas.errors import ConfigError

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[str, ...] = ("auto", "json", "console")
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")


#: Lines waiting for the writer thread; past this, new lines are dropped (and counted).
QUEUE_LINES = 10_000
#: How long exit waits for queued lines to be written.
EXIT_FLUSH_S = 2.0


class QuietOnBrokenPipe:
    """A structlog logger that hands whole lines to a writer thread; it never blocks and
    never raises. After one failed write (broken pipe, closed descriptor) every line is
    dropped; so is a line that finds the queue full."""

    def __init__(self, file: TextIO, max_lines: int = QUEUE_LINES) -> None:
        self._file = file
        try:
            self._fd: int | None = file.fileno()
        except (AttributeError, OSError, ValueError):  # a replaced stream (tests)
            self._fd = None
        self._queue: queue.Queue[str] = queue.Queue(max_lines)
        self.broken = False
        self.dropped = 0
        threading.Thread(target=self._drain, name="log-writer", daemon=True).start()

    def msg(self, message: str) -> None:
        if self.broken:
            return
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.dropped += 1

    def _drain(self) -> None:
        while True:
            message = self._queue.get()
            try:
                if not self.broken:
                    self._write(message + "\n")
            except (OSError, ValueError):
                self.broken = True
            finally:
                self._queue.task_done()

    def _write(self, line: str) -> None:
        if self._fd is None:
            self._file.write(line)
            self._file.flush()
            return
        data = line.encode("utf-8", "replace")
        while data:  # a pipe may take part of a long line
            data = data[os.write(self._fd, data):]

    def flush(self, timeout_s: float = EXIT_FLUSH_S) -> None:
        """Wait (a bounded time) until every queued line is written or dropped."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _Factory:
    def __init__(self, file: TextIO) -> None:
        self._logger = QuietOnBrokenPipe(file)
        atexit.register(self._logger.flush)

    def __call__(self, *args: Any) -> QuietOnBrokenPipe:
        return self._logger


def check_logging(fmt: str, level: str) -> tuple[LogFormat, int]:
    """Parse the log options, or raise a ConfigError naming the accepted values."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"--log-format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    if level.lower() not in LOG_LEVELS:
        raise ConfigError(f"--log-level {level!r}: expected one of {', '.join(LOG_LEVELS)}")
    return fmt, logging.getLevelNamesMapping()[level.upper()]  # type: ignore[return-value]


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Called once by the CLI; library code only ever calls ``structlog.get_logger``."""
    fmt, numeric = check_logging(fmt, level)
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    # with OTEL_* set (decided here, once), each line names the span it was logged in
    on = tracer("batchfleet-worker") is not None
    traced: list[structlog.typing.Processor] = [add_trace_ids] if on else []
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *traced,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_Factory(sys.stderr),
        cache_logger_on_first_use=True,
    )
