"""Watching a job's first rows: stop early when they mostly fail, and say why.

A wrong option (an ``id`` column stacked into the features, whole numbers read
as int64, a misnamed ``inputs`` field) fails every row in the same way, and a
wrong file fails most rows in a few ways. Scoring the whole file would only
fill the errors file, so two checks run over the first ``rows`` rows of a job:
when they all fail with one non-retryable error, the job stops naming it; when
more than ``max_rate`` of them fail (non-retryable), it stops giving the rate
and the most common error. A failure whose fix is a known option also gets a
hint in its message (``--dtype float32``), in the errors file and in the stop line.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from typing import Final

from batchfleet.producers.bulk.errors import EarlyStopError
from batchfleet.schemas.envelopes import ErrorInfo, Result

#: "line 12: ..." / "row 7: ...": where a message is, not what it says.
_WHERE: Final = re.compile(r"^(?:line|row) \d+: ")
_DIGITS: Final = re.compile(r"\d+")
#: The worker's dtype refusal when a float model is sent integers.
_INT_FOR_FLOAT: Final = re.compile(r"expected (float(?:16|32|64))\b.*\bgot (?:u?int\d+|bool)\b")


def dtype_hint(message: str) -> str:
    """The message, plus the ``--dtype`` that fixes it when floats were expected and ints sent.

    Whole-number JSON (``[1, 2, 3]``) and integer Parquet columns are read as
    int64 under ``--dtype auto``; a float32 model refuses them.
    """
    match = _INT_FOR_FLOAT.search(message)
    if match is None or "--dtype" in message:
        return message
    return (f"{message} (whole numbers are read as integers: run with --dtype {match[1]} "
            "to send them as floats)")


def with_hint(result: Result) -> Result:
    """The result, its error message carrying a fix where one is known."""
    error = result.error
    if error is None:
        return result
    hinted = dtype_hint(error.message)
    if hinted == error.message:
        return result
    return dataclasses.replace(result, error=dataclasses.replace(error, message=hinted))


def _key(error: ErrorInfo) -> tuple[str, str]:
    """Two failures are "the same" when they differ only in numbers (lines, rows, sizes)."""
    return error.type, _DIGITS.sub("#", _WHERE.sub("", error.message))


def over_rate(failed: int, rows: int, max_rate: float) -> bool:
    """Whether ``failed`` of the first ``rows`` is more than ``max_rate`` (1.0: never)."""
    return rows > 0 and max_rate < 1.0 and failed > max_rate * rows


class EarlyStop:
    """Raises :class:`EarlyStopError` when the first ``rows`` results fail too much.

    Two checks, both decided once the first ``rows`` results are in (seen in row
    order): all failed alike (the message names the one error), or more than
    ``max_rate`` failed (the message gives the rate and the most common error).
    The first wins when both hold, being the more specific. After ``rows``
    results the guard disarms for good, so it costs nothing past the job's
    start. The job does not checkpoint when it stops this way, so running it
    again stops again until the cause is fixed.
    """

    def __init__(self, rows: int, hints: Sequence[str] = (), seen: int = 0, *,
                 max_rate: float = 1.0, failed: int | None = None) -> None:
        """``seen``/``failed``: rows a previous run saved and how many of them failed
        (default: all); their errors are not known, only counted."""
        failed = seen if failed is None else failed
        self._rows, self._hints, self._max_rate = rows, tuple(hints), max_rate
        self.armed = seen < rows
        self._seen, self._failed = seen, failed
        self._alike = failed == seen  # every row so far failed, with one error
        self._first: ErrorInfo | None = None
        self._errors: Counter[tuple[str, str]] = Counter()
        self._example: dict[tuple[str, str], ErrorInfo] = {}

    def see(self, result: Result) -> None:
        if not self.armed:
            return
        self._seen += 1
        error = result.error
        if result.status != "failed" or error is None or error.retryable:
            self._alike = False
        else:
            self._failed += 1
            key = _key(error)
            self._errors[key] += 1
            self._example.setdefault(key, error)
            if self._first is not None and key != _key(self._first):
                self._alike = False
            self._first = self._first or error
        if self._seen < self._rows:
            return
        self.armed = False
        if self._alike and self._first is not None:
            raise EarlyStopError(self.message(self._first))
        if over_rate(self._failed, self._rows, self._max_rate) and self._errors:
            common, count = self._errors.most_common(1)[0]
            raise EarlyStopError(self.rate_message(self._example[common], count))

    def message(self, error: ErrorInfo) -> str:
        what = _WHERE.sub("", error.message)
        hints = "".join(f"; {hint}" for hint in self._hints)
        return (f"stopped early: the first {self._rows:,} rows all failed the same way "
                f"({error.type}: {what}){hints}. Fix the input or options, then run again "
                "with --restart (or --early-stop-rows 0 to score every row anyway)")

    def rate_message(self, error: ErrorInfo, count: int) -> str:
        what = _WHERE.sub("", error.message)
        hints = "".join(f"; {hint}" for hint in self._hints)
        return (f"stopped early: {self._failed:,} of the first {self._rows:,} rows failed "
                f"({self._failed / self._rows:.0%}, over --early-stop-rate "
                f"{self._max_rate:g}); most common ({count:,}): {error.type}: {what}{hints}. "
                "Fix the input or options, then run again with --restart (or "
                "--early-stop-rate 1 to score every row anyway)")
