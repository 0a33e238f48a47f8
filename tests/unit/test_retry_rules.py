from __future__ import annotations

import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.errors import StalledError
from batchfleet.workers.completion import ack_plan, storable
from batchfleet.workers.intake import Answer
from batchfleet.workers.retry import CRASH_LOOP, STALLED, RetryConfig, decide

pytestmark = pytest.mark.unit
CFG = RetryConfig(max_attempts=3)


def test_retryable_errors_retry_until_attempts_run_out_then_dead_letter() -> None:
    err = ErrorInfo("model_error", "boom", retryable=True)
    assert [decide(err, n, CFG) for n in (1, 2, 3)] == ["retry", "retry", "dead_letter"]


def test_validation_errors_are_never_retried_and_crash_loops_go_to_the_dlq() -> None:
    assert decide(ErrorInfo("validation_error", "bad", False), 1, CFG) == "fail"
    assert decide(ErrorInfo(CRASH_LOOP, "died", False), 1, CFG) == "dead_letter"


def test_a_request_stalled_twice_goes_to_the_dlq_at_once() -> None:
    stalled = ErrorInfo.from_exception(StalledError("stalled compute 2 times"))
    assert (stalled.type, stalled.retryable) == (STALLED, False)
    assert decide(stalled, 1, CFG) == "dead_letter"


def test_retry_specs() -> None:
    default = RetryConfig(3, 0.5, 30.0)
    assert RetryConfig.parse("5", default) == RetryConfig(5, 0.5, 30.0)
    assert RetryConfig.parse("5:0.1:2", default) == RetryConfig(5, 0.1, 2.0)
    for bad in ("0", "x", "1:2:1", "1:2:3:4"):
        with pytest.raises(ValueError):
            RetryConfig.parse(bad, default)


def _answer(rid: str, generation: int = 0) -> Answer:
    delivery = Delivery("m", "interactive", b"", (b"s", rid.encode()), 1)
    return Answer(delivery, Result(rid, "failed", generation=generation), None, generation)


def test_ack_plan_acks_only_deliveries_with_a_durable_outcome() -> None:
    """Written, or refused by the store with a generation it compares exactly (so the
    refusal means: already terminal, or superseded), or parked, or superseded."""
    won, refused_ok, unsound = _answer("a"), _answer("b", 2**53 - 1), _answer("c", 2**64 - 1)
    parked = Delivery("m", "interactive", b"", (b"s", b"p"), 1)
    stale = Delivery("m", "interactive", b"", (b"s", b"q"), 1)
    ok, refused = ack_plan([won, refused_ok, unsound], [True, False, False], [parked], [stale])
    assert ok == [won.delivery, refused_ok.delivery, parked, stale]
    assert refused == [unsound.delivery]
    # a write that won is durable whatever generation it carried
    assert ack_plan([unsound], [True]) == ([unsound.delivery], [])
    with pytest.raises(ValueError):
        ack_plan([won], [])


def test_answers_are_written_with_a_generation_the_store_compares_exactly() -> None:
    huge = _answer("h", 2**64 - 1)
    fixed = storable(huge)
    assert fixed.generation == 0 and fixed.result.generation == 0
    assert fixed.delivery is huge.delivery
    fine = _answer("f", 5)
    assert storable(fine) is fine
