from __future__ import annotations

import numpy as np
import pytest

from batchfleet.schemas.errors import ComputeTimeoutError, InvalidInputError, ModelError
from batchfleet.workers.breaker import BreakerConfig, BreakerState, CircuitBreaker
from batchfleet.workers.guards import Guards, Outcome, batch_failed, batch_outcome
from batchfleet.workers.middleware.base import Batch, BatchKey
from batchfleet.workers.runner import BatchRun

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _breaker(**kw: float) -> tuple[CircuitBreaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    cfg = BreakerConfig(**{"consecutive_failures": 3, "cooldown_s": 5.0, **kw})  # type: ignore[arg-type]
    breaker = CircuitBreaker("model", cfg, clock,
                             lambda _n, a, b: changes.append((a.value, b.value)))
    return breaker, clock, changes


def test_trips_on_consecutive_failures_then_cools_down_to_a_single_probe() -> None:
    breaker, clock, changes = _breaker()
    for _ in range(2):
        breaker.record_failure()
    assert breaker.allow() and breaker.state is BreakerState.CLOSED
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    assert breaker.seconds_until_probe() == pytest.approx(5.0)
    clock.now = 5.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one probe at a time
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_failed_probe_reopens_for_another_cooldown() -> None:
    breaker, clock, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 6.0
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.now = 10.0
    assert breaker.state is BreakerState.OPEN
    clock.now = 11.0
    assert breaker.state is BreakerState.HALF_OPEN


def test_trips_on_error_rate_over_the_window_without_a_streak() -> None:
    breaker, _, _ = _breaker(consecutive_failures=100, failure_rate=0.5, window=10, min_calls=10)
    for i in range(9):
        (breaker.record_failure if i % 2 else breaker.record_success)()
    assert breaker.state is BreakerState.CLOSED  # under min_calls
    breaker.record_failure()  # 5 of 10 failed
    assert breaker.state is BreakerState.OPEN


def test_successes_reset_the_streak() -> None:
    breaker, _, _ = _breaker(failure_rate=1.0)
    for _ in range(10):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state is BreakerState.CLOSED


def test_a_neutral_outcome_frees_the_probe_without_deciding() -> None:
    breaker, clock, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 5.0
    assert breaker.allow() and not breaker.allow()
    breaker.record_neutral()
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allow()


def test_a_late_success_while_open_does_not_close_it() -> None:
    breaker, _, _ = _breaker()
    for _ in range(3):
        breaker.record_failure()
    breaker.record_success()
    assert breaker.state is BreakerState.OPEN


# --- per-model guards ------------------------------------------------------------------


def _run(*outputs: object) -> BatchRun:
    return BatchRun(list(outputs), 0.0, 0.001, 1)  # type: ignore[arg-type]


OK = np.zeros(1, np.float32)


def _guards(clock: Clock) -> Guards:
    cfg = BreakerConfig(consecutive_failures=2, cooldown_s=5.0)
    return Guards(cfg, cfg, ["a", "b"], clock)


def test_one_models_failures_open_only_its_own_breaker_and_pause_only_its_lanes() -> None:
    clock = Clock()
    guards = _guards(clock)
    for i in range(2):
        guards.record_batch("a", _run(ModelError("down"), ModelError("down")), [f"x{i}", f"y{i}"])
    assert guards.model_states() == {"a": "open", "b": "closed"}
    assert guards.paused_models() == {"a"} and guards.fetch_paused()
    assert not guards.allow("a") and guards.allow("b")
    assert guards.states() == {"model": "open", "result_store": "closed"}
    assert guards.model.trips == 1 and guards.model["b"].trips == 0
    # a refused batch is held, and runs as the probe once the cooldown is over
    held = Batch(BatchKey(0, "a", ()), [])
    held.jobs.append(object())  # type: ignore[arg-type]
    guards.hold("a", held)
    assert guards.take_held() is None and guards.held() == {"a": 1}
    clock.now = 5.0
    assert guards.take_held() is held and not guards.allow("a")
    guards.record_batch("a", _run(OK), ["z"])
    assert guards.paused_models() == frozenset() and guards.held_wait_s() is None


def test_the_store_breaker_pauses_every_models_lanes() -> None:
    guards = _guards(Clock())
    guards.record_store(False)
    guards.record_store(False)
    assert guards.paused_models() == {"a", "b"}


def test_failures_bisection_pins_on_single_requests_never_count() -> None:
    guards = _guards(Clock())
    for i in range(10):  # one poisoned request per batch, neighbours fine
        run = _run(OK, ModelError("poison"), OK)
        assert batch_outcome(run) is Outcome.PINNED and not batch_failed(run)
        guards.record_batch("a", run, [f"ok{i}", f"bad{i}", f"ok2{i}"])
    # the same known-bad requests retried alone fail again: still their problem
    for i in range(10):
        guards.record_batch("a", _run(ModelError("poison")), [f"bad{i}"])
    # so is input the model refuses as invalid, however many fail together
    for _ in range(10):
        guards.record_batch("a", _run(InvalidInputError("bad token"), InvalidInputError("x")),
                            ["i1", "i2"])
    assert guards.model["a"].state is BreakerState.CLOSED and guards.model.trips == 0
    # a batch where every split failed is batch-wide: it counts
    guards.record_batch("a", _run(ModelError("device"), ModelError("device")), ["n1", "n2"])
    guards.record_batch("a", _run(ComputeTimeoutError("slow")), ["n3"])
    assert guards.model["a"].state is BreakerState.OPEN


def test_a_suspect_run_alone_frees_the_probe_and_decides_nothing() -> None:
    clock = Clock()
    guards = _guards(clock)
    for _ in range(2):
        guards.record_batch("b", _run(ModelError("down")), ["n"])
    clock.now = 5.0
    assert guards.allow("b")
    guards.record_batch("b", _run(ModelError("crash")), ["s"], telling=False)
    assert guards.model["b"].state is BreakerState.HALF_OPEN and guards.allow("b")


async def test_a_probe_batch_that_is_not_computed_gives_the_probe_back() -> None:
    """Half-open, the one probe went to a batch that a later middleware then forwarded (or
    that expired while held): the breaker must offer the probe again, not stay stuck."""
    from batchfleet.workers.middleware import Chain, Middleware
    from batchfleet.workers.middleware.breakers import Breakers

    class Forwards(Middleware):  # e.g. routing sending the batch to another worker
        async def before_compute(self, batch: Batch) -> bool:
            return False

    clock = Clock()
    guards = _guards(clock)
    for i in range(2):
        guards.record_batch("a", _run(ModelError("down"), ModelError("down")), [f"x{i}", f"y{i}"])
    clock.now = 5.0  # half-open
    chain = Chain([Breakers(guards), Forwards()])
    batch = Batch(BatchKey(0, "a", ()), [])
    assert not await chain.before_compute(batch)  # took the probe, then was forwarded
    assert guards.allow("a")  # the probe is free again (and this took it)
    guards.model["a"].record_neutral()
    # and a held batch that expired before it ran gives its probe back too
    held = Batch(BatchKey(0, "a", ()), [])
    guards.hold("a", held)
    found = chain.take_held()
    assert found is not None and found[0] is held and not guards.allow("a")
    await chain.dropped(held, found[1])
    assert guards.allow("a")
