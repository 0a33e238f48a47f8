"""The rules of loading on demand (``workers.residency``), as pure decisions."""

from __future__ import annotations

from batchfleet.workers.residency import Decision, Limits, Resident, decide, fits, wanted

TWO = Limits(max_models=2, min_residency_s=10.0)


def _r(loaded_at: float, last_used: float, mb: float = 0.0, busy: bool = False) -> Resident:
    return Resident(loaded_at, last_used, mb, busy)


def test_wanted_is_not_loaded_old_enough_and_oldest_first() -> None:
    waiting = {"a": 1.0, "b": 3.0, "c": 0.2, "d": 5.0}
    assert wanted(waiting, ["d"], {"c": 0.5}) == ["b", "a"]


def test_a_model_loads_when_it_fits() -> None:
    assert decide({"a": _r(0, 0)}, ["b"], {"b": 0.1}, {}, TWO, now=1.0) == Decision(load="b")


def test_the_least_recently_used_idle_model_makes_room() -> None:
    residents = {"a": _r(0, 50), "b": _r(0, 40)}
    assert decide(residents, ["c"], {"c": 0.1}, {}, TWO, now=100) == Decision("c", ("b",))


def test_a_model_is_not_evicted_within_its_minimum_residency() -> None:
    residents = {"a": _r(95, 95), "b": _r(0, 40, busy=True)}
    assert decide(residents, ["c"], {"c": 0.1}, {}, TWO, now=100) == Decision()


def test_busy_models_are_preempted_only_for_a_request_that_waited_past_the_minimum() -> None:
    residents = {"a": _r(0, 99, busy=True), "b": _r(5, 99, busy=True)}
    assert decide(residents, ["c"], {"c": 3.0}, {}, TWO, now=100) == Decision()
    assert decide(residents, ["c"], {"c": 11.0}, {}, TWO, now=100) == Decision("c", ("a",))


def test_the_memory_budget_evicts_as_many_as_it_takes() -> None:
    budget = Limits(budget_mb=100, min_residency_s=0)
    residents = {"a": _r(0, 1, mb=40), "b": _r(0, 2, mb=40), "c": _r(0, 3, mb=10)}
    assert decide(residents, ["d"], {"d": 1}, {"d": 60}, budget, now=10) == Decision(
        "d", ("a", "b"))
    # a size not given (the caller estimates one from start-up): counted as 0
    assert decide(residents, ["d"], {"d": 1}, {}, budget, now=10) == Decision("d")


def test_a_model_larger_than_the_budget_still_loads_alone() -> None:
    budget = Limits(budget_mb=10, min_residency_s=0)
    assert fits({}, 50, budget)
    assert decide({"a": _r(0, 0, mb=5)}, ["b"], {"b": 1}, {"b": 50}, budget,
                  now=1) == Decision("b", ("a",))


def test_nothing_wanted_nothing_done() -> None:
    assert decide({"a": _r(0, 0)}, [], {}, {}, TWO, now=1) == Decision()


def test_status_shows_the_loaded_set_from_the_heartbeat() -> None:
    """A worker that loads on demand says which models it holds; one that does not holds
    them all (``batchfleet status``'s ``loaded`` column)."""
    from batchfleet.connectors.fleet import worker_view
    from batchfleet.schemas.heartbeat import decode_heartbeat, encode_heartbeat
    from batchfleet.status import loaded_cell

    beat = {"worker_id": "w", "models": ["a", "b", "c"], "seen_at": 1.0}
    on_demand = decode_heartbeat(encode_heartbeat({**beat, "loaded": ["a", "c"]}))
    every = decode_heartbeat(encode_heartbeat(beat))
    assert on_demand is not None and every is not None
    assert worker_view(on_demand, 2.0).loaded == ("a", "c")
    assert worker_view(every, 2.0).loaded is None
    assert loaded_cell(("a", "c")) == "a, c"
    assert loaded_cell(()) == "—"
    assert loaded_cell(None) == "all"


def test_the_on_demand_bench_moves_a_hot_pair_and_marks_one_first_request_per_phase() -> None:
    """``bench --on-demand``'s traffic: phase k sends to models k and k+1 only, and the
    first request of each phase to model k+1 (the one it brings in) is marked."""
    import numpy as np

    from batchfleet.bench.on_demand import schedule

    offsets = np.arange(0.0, 12.0, 0.05)
    models, first = schedule(offsets, 4, 2.0, np.random.default_rng(1))
    for offset, model in zip(offsets, models, strict=True):
        phase = int(offset // 2.0)
        assert model in (f"enc{phase % 4}", f"enc{(phase + 1) % 4}")
    marked = [(int(o // 2.0), m) for o, m, f in zip(offsets, models, first, strict=True) if f]
    assert [p for p, _ in marked] == list(range(6))
    assert all(m == f"enc{(p + 1) % 4}" for p, m in marked)


def test_a_lane_without_an_age_waits_from_when_it_was_first_seen() -> None:
    """Kafka's lag has no age: the wait runs from the first look that saw work, and starts
    again once the lane was seen empty."""
    from batchfleet.connectors.broker import LaneBacklog
    from batchfleet.workers.middleware.residency import waiting_ages

    seen: dict[str, float] = {}
    kafka = [LaneBacklog("a", "interactive", 3), LaneBacklog("a@default", "bulk", 0)]
    assert waiting_ages(kafka, seen, now=10.0) == {"a": 0.0}
    assert waiting_ages(kafka, seen, now=12.5) == {"a": 2.5}
    assert waiting_ages([LaneBacklog("a", "interactive", 0)], seen, now=13.0) == {}
    assert waiting_ages(kafka, seen, now=20.0) == {"a": 0.0}
    redis = [LaneBacklog("b", "interactive", 1, 4.0), LaneBacklog("b", "bulk", 2, 7.0)]
    assert waiting_ages(redis, {}, now=20.0) == {"b": 7.0}
