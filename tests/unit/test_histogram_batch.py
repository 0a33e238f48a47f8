"""A batch of latencies observed per bucket gives the same exposition as observing each
value (``workers/metrics.py::_observe_all``), on bucket edges, zero, infinity and NaN."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import Result, Status
from batchfleet.workers.completion import Completed
from batchfleet.workers.jobs import Answer
from batchfleet.workers.metrics import _LATENCY_BUCKETS, WorkerMetrics, _observe_all

pytestmark = pytest.mark.unit


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but ``_created`` (a wall-clock time) by name and labels."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if not s.name.endswith("_created")}


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    one, batched = CollectorRegistry(), CollectorRegistry()
    return (one, Histogram("lat", "x", ["m"], buckets=_LATENCY_BUCKETS, registry=one),
            batched, Histogram("lat", "x", ["m"], buckets=_LATENCY_BUCKETS, registry=batched))


def _assert_same(one: CollectorRegistry, batched: CollectorRegistry) -> None:
    expected, got = _samples(one), _samples(batched)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        if math.isnan(value):
            assert math.isnan(got[key]), key
        else:  # the sum is added once, not value by value: equal to rounding
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


EDGES = [0.0, *_LATENCY_BUCKETS, 0.0010000001, 0.0009999999, 299.9, 300.0, 300.1, math.inf]


def test_bucket_edges_zero_and_infinity_land_where_observe_puts_them() -> None:
    one, h1, batched, h2 = _pair()
    for value in EDGES:
        h1.labels("m").observe(value)
    _observe_all(h2.labels("m"), EDGES)
    _assert_same(one, batched)
    # and the edges really fill distinct buckets (a check that cannot pass by accident)
    counts = {k[1]: v for k, v in _samples(batched).items() if k[0] == "lat_bucket"}
    assert counts[(("le", "0.001"), ("m", "m"))] == 3  # 0.0, 0.001 and just below it


def test_nan_lands_in_no_bucket_and_makes_the_sum_nan_as_observe_does() -> None:
    one, h1, batched, h2 = _pair()
    values = [0.002, math.nan, 0.5]
    for value in values:
        h1.labels("m").observe(value)
    _observe_all(h2.labels("m"), values)
    _assert_same(one, batched)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), max_size=300),
       st.integers(min_value=1, max_value=4))
def test_any_batch_matches_observing_value_by_value(values: list[float], rounds: int) -> None:
    one, h1, batched, h2 = _pair()
    h1.labels("m")  # the child exists in both, also for an empty batch
    for _ in range(rounds):
        for value in values:
            h1.labels("m").observe(value)
        _observe_all(h2.labels("m"), values)
    _assert_same(one, batched)


def test_a_histogram_without_the_expected_internals_is_observed_value_by_value() -> None:
    seen: list[float] = []

    class Plain:
        def observe(self, amount: float) -> None:
            seen.append(amount)

    _observe_all(Plain(), [0.1, 0.2])  # type: ignore[arg-type]
    assert seen == [0.1, 0.2]


def test_a_completed_batch_fills_both_latency_histograms_once_per_first_write() -> None:
    """``on_completed`` counts every first write's end-to-end latency and every success's
    queue wait, and no duplicate's, through the batched path."""
    metrics = WorkerMetrics()
    now = 1_000.0
    answers, won = [], []
    ok: tuple[Status, bool] = ("succeeded", True)
    outcomes: list[tuple[Status, bool]] = [ok] * 5 + [("failed", True), ("succeeded", False)]
    for i, (status, first) in enumerate(outcomes):
        result = Result(request_id=f"r{i}", status=status, model="m", enqueued_at=now - 0.02 * i,
                        queue_ms=4.0 if status == "succeeded" else None)
        answers.append(Answer(Delivery("m", "interactive", b"", i), result))
        won.append(first)
    metrics.on_completed(Completed(answers=answers, won=won), now)
    samples = _samples(metrics.registry)
    lane = (("lane", "interactive"), ("model", "m"))
    assert samples[("batchfleet_end_to_end_seconds_count", lane)] == 6  # not the duplicate
    assert samples[("batchfleet_end_to_end_seconds_sum", lane)] == pytest.approx(
        0.02 * sum(range(6)))
    def bucket(name: str, le: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (f"batchfleet_{name}_bucket", tuple(sorted((("le", le), *lane))))

    assert samples[bucket("end_to_end_seconds", "0.05")] == 3
    assert samples[("batchfleet_queue_wait_seconds_count", lane)] == 5  # successes only
    assert samples[bucket("queue_wait_seconds", "0.005")] == 5
