"""``batchfleet check``'s judgement of one fleet snapshot (a pure function)."""

from __future__ import annotations

import pytest

from batchfleet.cli_control import fleet_problems
from batchfleet.connectors.fleet import FleetSnapshot, LaneView

pytestmark = pytest.mark.unit


def _lane(model: str, lane: str = "interactive", *, depth: int = 0, age: float | None = None,
          rate: float = 0.0, workers: int = 1,
          breakers: dict[str, dict[str, int]] | None = None) -> LaneView:
    return LaneView(model=model, lane=lane, depth=depth, lag=depth, pending=0,
                    oldest_age_s=age, p99_ms=None, time_to_drain_s=None, throughput_rps=rate,
                    workers=workers, dlq=0, breakers=breakers or {})


def _snap(*lanes: LaneView) -> FleetSnapshot:
    return FleetSnapshot(0.0, "bf", "redis", lanes, (), 0, 0)


def test_a_served_idle_fleet_is_healthy() -> None:
    snap = _snap(_lane("a"), _lane("a", "bulk"))
    assert fleet_problems(snap, 300) == []


def test_no_worker_is_reported_once_per_model_and_for_unknown_names() -> None:
    snap = _snap(_lane("a", workers=0), _lane("a", "bulk", workers=0))
    kinds = [(p.kind, p.model) for p in fleet_problems(snap, 300, ["a", "ghost"])]
    assert kinds == [("no_worker", "a"), ("no_worker", "ghost")]


def test_stalled_needs_depth_age_and_no_progress() -> None:
    old = _lane("a", "bulk", depth=5, age=400)
    assert [p.kind for p in fleet_problems(_snap(old), 300)] == ["stalled"]
    moving = _lane("a", "bulk", depth=5, age=400, rate=12.0)
    young = _lane("a", "bulk", depth=5, age=100)
    assert fleet_problems(_snap(moving), 300) == fleet_problems(_snap(young), 300) == []


def test_an_open_breaker_is_a_problem_and_other_models_can_be_left_out() -> None:
    snap = _snap(_lane("a", breakers={"model": {"open": 1, "closed": 2}}, workers=3),
                 _lane("b", workers=0))
    problems = fleet_problems(snap, 300, ["a"])
    assert [p.message for p in problems] == ["a: breaker model open on 1 of 3 worker(s)"]


def test_a_stuck_compute_thread_is_a_problem_for_its_model() -> None:
    from batchfleet.connectors.fleet import WorkerView

    worker = WorkerView("w1", "h", ("a", "b"), "cpu", "redis", {}, 0, 0.0, 1.0, 9.0, {}, {},
                        stuck_compute={"a": 42.0})
    snap = FleetSnapshot(0.0, "bf", "redis", (_lane("a"), _lane("b")), (worker,), 0, 0)
    problems = fleet_problems(snap, 300)
    assert [(p.kind, p.model) for p in problems] == [("compute_stuck", "a")]
    assert "a: compute stuck for 42s past its limit on worker w1" in problems[0].message
    assert fleet_problems(snap, 300, ["b"]) == []
