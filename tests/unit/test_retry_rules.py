from __future__ import annotations

import pytest

from schemas.envelopes import ErrorInfo
from workers.retry import CRASH_LOOP, RetryConfig, decide

pytestmark = pytest.mark.unit
CFG = RetryConfig(max_attempts=3)


def test_retryable_errors_retry_until_attempts_run_out_then_dead_letter() -> None:
    err = ErrorInfo("model_error", "boom", retryable=True)
    assert [decide(err, n, CFG) for n in (1, 2, 3)] == ["retry", "retry", "dead_letter"]


def test_validation_errors_are_never_retried_and_crash_loops_go_to_the_dlq() -> None:
    assert decide(ErrorInfo("validation_error", "bad", False), 1, CFG) == "fail"
    assert decide(ErrorInfo(CRASH_LOOP, "died", False), 1, CFG) == "dead_letter"


def test_retry_specs() -> None:
    default = RetryConfig(3, 0.5, 30.0)
    assert RetryConfig.parse("5", default) == RetryConfig(5, 0.5, 30.0)
    assert RetryConfig.parse("5:0.1:2", default) == RetryConfig(5, 0.1, 2.0)
    for bad in ("0", "x", "1:2:1", "1:2:3:4"):
        with pytest.raises(ValueError):
            RetryConfig.parse(bad, default)
