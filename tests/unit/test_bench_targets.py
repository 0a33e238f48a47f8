from __future__ import annotations

import numpy as np
import pytest

from batchfleet.bench.cache_row import _differing_rows, _hit_ratio
from batchfleet.bench.targets import evaluate

pytestmark = pytest.mark.unit


def _cache_row(speedup: float, hit_ratio: float, differing: int) -> dict[str, object]:
    return {"rows": 20_000, "repeats": 10_000, "speedup": speedup, "hit_ratio": hit_ratio,
            "identical_outputs": differing == 0, "differing_rows": differing,
            "max_abs_diff": 0.0 if differing == 0 else 1e-3,
            "cache_on": {"rows_per_s": 600.0}, "cache_off": {"rows_per_s": 300.0}}


def test_the_cache_row_is_met_only_when_fast_identical_and_half_hits() -> None:
    met = {t.name: t.met for t in evaluate({"cache_bulk": _cache_row(1.9, 0.503, 0)})}
    assert met == {"cache bulk row: cache on / off": True,
                   "cache bulk row: rows whose outputs differ, cache on vs off": True,
                   "cache bulk row: hit ratio off 50%": True}
    missed = {t.name: t.met for t in evaluate({"cache_bulk": _cache_row(1.7, 0.52, 3)})}
    assert not any(missed.values())


def test_a_skipped_cache_row_adds_no_target() -> None:
    assert evaluate({"cache_bulk": {"skipped": "no --cache-ttl-s"}}) == []


def test_rows_that_differ_are_counted_bit_for_bit() -> None:
    a = np.zeros((4, 3), np.float32)
    b = a.copy()
    b[1, 2] = np.float32(1e-7)
    b[3, 0] = -0.0  # equal under ==, as a cached copy of the same float is
    assert _differing_rows(a, b) == 1
    assert _differing_rows(a, a[:2]) is None


def test_the_hit_ratio_counts_coalesced_answers_as_hits() -> None:
    assert _hit_ratio({"cache_hits": 9_000, "cache_coalesced": 1_000, "cache_misses": 10_000,
                       "cache_errors": 0}) == 0.5
    assert _hit_ratio({"cache_hits": 0, "cache_coalesced": 0, "cache_misses": 0,
                       "cache_errors": 0}) is None


def test_tracing_off_is_a_target_and_a_tracing_layer_would_show() -> None:
    (t,) = evaluate({"tracing_unset": {"us_per_request": 0.03, "client_us_per_request": 0.03,
                                       "worker_tracing_layer": False}})
    assert t.met and "no tracing middleware" in t.detail


def test_the_encoder_target_names_the_median_round_the_forward_and_the_loop() -> None:
    scenario = {"model": "demo-encoder", "transport": "redis", "throughput": {
        "throughput_rps": 300.0, "time_split": {"mean_compute_ms": 100.0},
        "worker_threads": {"loop_busy_frac": 0.04, "loop_wait_frac": 0.03,
                           "compute_threads_frac": 1.7}}}
    ceiling = {"batch_size": 32, "forward": {"samples_per_s": 400.0, "ms_per_batch": 80.0,
                                             "rounds": [400.0, 320.0, 360.0]}}
    [target] = [t for t in evaluate({"scenarios": [scenario],
                                     "ceilings": {"demo-encoder": ceiling}})
                if t.name.startswith("demo-encoder")]
    assert target.value == 0.75 and not target.met
    assert "0.83 of the ceiling's median round (360.0/s; rounds 320.0-400.0)" in target.detail
    assert "forward 100.0 ms per batch in the worker vs 80.0 ms alone" in target.detail
    assert "event loop busy 0.04 cores, compute threads 1.70" in target.detail


def _mlp(transport: str, p99: float, overhead: float) -> dict[str, object]:
    return {"model": "demo-mlp", "transport": transport, "max_wait_ms": 5.0, "latency": [],
            "latency_coalesced": {"load": 0.5, "offered_rps": 1000.0,
                                  "latency": {"p99_ms": p99}, "latency_fleet": {}},
            "throughput": {"throughput_rps": 1.0, "worker_overhead_us_per_request": {
                "as_specified": overhead, "cpu_corrected": overhead}}}


def test_kafka_parity_takes_the_broker_loop_as_reference_where_it_is_the_floor() -> None:
    scenarios = [_mlp("redis", 20.0, 30.0), _mlp("kafka", 60.0, 40.0)]

    def parity(report: dict[str, object]) -> dict[str, tuple[float, bool]]:
        return {t.name.split(" (")[0]: (t.value, t.met) for t in evaluate(report)
                if t.name.startswith("Kafka / Redis")}
    alone = parity({"scenarios": scenarios})
    assert alone == {"Kafka / Redis caller-side p99 at 50%, submit_many producers": (3.0, False),
                     "Kafka / Redis worker CPU per request outside the model": (1.33, True)}
    floor = {"kafka": {"latency_ms": {"p50": 20.0, "p99": 45.0, "max": 50.0}}}
    with_loop = parity({"scenarios": scenarios, "broker_loop": floor})
    assert with_loop["Kafka / Redis caller-side p99 at 50%, submit_many producers"] == (1.33, True)


def test_the_slo_row_names_a_step_the_machine_could_not_carry() -> None:
    def point(load: float, offered: float, achieved: float, p99: float) -> dict[str, float]:
        return {"load": load, "offered_rps": offered, "achieved_rps": achieved,
                "fleet_p99_ms": p99}
    slo = {"latency_slo_ms": 20.0, "max_fleet_p99_ms": 601.7, "throughput_rps": 41_838.0,
           "throughput_vs_best_fixed": 1.01,
           "points": [point(0.6, 25_102.7, 25_074.7, 25.75),
                      point(0.8, 33_470.2, 30_729.2, 601.7)]}
    (t,) = evaluate({"sweep_slo": slo})
    assert not t.met  # still missed: the row reports, it does not excuse
    assert "80%: 602 (overloaded: achieved 30,729 of 33,470 req/s)" in t.detail
    assert "60%: 25.8," in t.detail  # 99.9% of the offered rate: carried, no flag
