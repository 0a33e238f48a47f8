"""Per-model figures of the fleet (issue 30): a model's own req/s, batch size, error and
degraded rates, from the per-model stats each heartbeat carries (pure functions)."""

from __future__ import annotations

import pytest

from batchfleet.connectors.fleet import WorkerView, summarize
from batchfleet.connectors.fleet_models import model_figures
from batchfleet.schemas.heartbeat import decode_heartbeat, encode_heartbeat

pytestmark = pytest.mark.unit


def _worker(wid: str, models: tuple[str, ...], rate: float,
            stats: dict[str, dict[str, float]]) -> WorkerView:
    return WorkerView(wid, "h", models, "cpu", "redis", {}, 0, rate, 1.0, 9.0, {}, {},
                      model_stats=stats)


def test_a_multi_model_worker_counts_each_model_at_its_own_rate() -> None:
    """The defect: status gave each model of a two-model worker the worker's whole rate."""
    both = _worker("w1", ("a", "b"), 30.0, {
        "a": {"rps": 25.0, "batches": 10, "rows": 80, "succeeded": 76, "failed": 4},
        "b": {"rps": 5.0, "batches": 5, "rows": 5, "succeeded": 5}})
    only_a = _worker("w2", ("a",), 10.0, {"a": {"rps": 10.0, "batches": 10, "rows": 20,
                                                "succeeded": 20}})
    snap = summarize("redis", "bf", ["a", "b"], [both, only_a], {}, {})
    rows = {lane.model: lane for lane in snap.lanes if lane.lane == "interactive"}
    assert rows["a"].throughput_rps == 35.0 and rows["b"].throughput_rps == 5.0
    assert rows["a"].mean_batch_size == 5.0  # 100 rows in 20 batches
    assert rows["a"].error_rate == pytest.approx(4 / 100)
    assert rows["b"].error_rate == 0.0 and rows["b"].degraded_rate is None


def test_an_older_worker_without_model_stats_keeps_its_whole_rate() -> None:
    old = _worker("w0", ("a", "b"), 12.0, {})
    figures = model_figures("b", [(old.model_stats, old.throughput_rps)])
    assert figures.throughput_rps == 12.0 and figures.mean_batch_size is None
    assert figures.error_rate is None


def test_degraded_rate_reads_the_workers_degraded_count_when_reported() -> None:
    stats = {"a": {"rps": 1.0, "succeeded": 8, "failed": 2, "degraded": 5}}
    assert model_figures("a", [(stats, 1.0)]).degraded_rate == 0.5
    assert model_figures("a", [({"a": {"rps": 0.0}}, 0.0)]).degraded_rate is None


def test_model_stats_travel_in_the_heartbeat_and_junk_is_dropped() -> None:
    raw = encode_heartbeat({"worker_id": "w", "model_stats": {
        "a": {"rps": 2.5, "batches": 3, "note": "x"}, "b": "junk"}})
    record = decode_heartbeat(raw)
    assert record is not None
    assert record.model_stats == {"a": {"rps": 2.5, "batches": 3.0}}
    assert "model_stats" not in record.extra
