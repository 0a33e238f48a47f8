"""The issue's targets, checked against one run's numbers: met or missed, and by how much.

Targets are ratios within one run (so the machine's speed cancels out: versus
the model alone, naive RQ and the broker-only loop) plus absolute goals:
demo-mlp caller-side p99 at half load for both submit styles, the worker's CPU
per request outside the model, and the SLO row's fleet-side p99 at every load
(issue 15). Nothing here measures; it only compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Issue 15's goals (earlier issues' goals, where stricter ones replaced them, in comments).
ENCODER_VS_CEILING = {"redis": 0.95, "kafka": 0.92}  # was 0.90 for both
MLP_VS_RQ = 100.0  # was 30
MLP_VS_BROKER_LOOP = 0.30
P99_SLACK_MS = 10.0
PER_ARRIVAL_P99_MS = 30.0
OVERHEAD_GOAL_US = 12.0  # was 15
CACHE_SPEEDUP = 1.8
#: The cache row's hit ratio must be 50 % within this many percentage points.
CACHE_HIT_SLACK_PP = 1.0
TRACING_UNSET_US = 1.0
#: Issue 31: Kafka within this factor of Redis (or of the Kafka broker-only loop's latency).
KAFKA_PARITY = 1.5


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    value: float
    goal: float
    #: "min": value must be >= goal; "max": value must be <= goal.
    sense: str
    unit: str
    detail: str

    @property
    def met(self) -> bool:
        if not math.isfinite(self.value):
            return False
        return self.value >= self.goal if self.sense == "min" else self.value <= self.goal

    @property
    def miss(self) -> str:
        """How far from the goal, in words ("" when met)."""
        if self.met:
            return ""
        if not math.isfinite(self.value):
            return "not measured"
        gap = abs(self.goal - self.value)
        rel = gap / self.goal if self.goal else math.inf
        return f"missed by {gap:.3g} {self.unit} ({rel:.0%})"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "goal": self.goal, "sense": self.sense,
                "unit": self.unit, "met": self.met, "miss": self.miss, "detail": self.detail}


def _num(value: Any) -> float:
    """A reported number, or NaN where the JSON holds null (nothing was measured)."""
    return float(value) if isinstance(value, int | float) else math.nan


def _scenario(report: dict[str, Any], model: str, transport: str) -> dict[str, Any] | None:
    for s in report.get("scenarios", []):
        if s["model"] == model and s["transport"] == transport:
            return s  # type: ignore[no-any-return]
    return None


def encoder_cause(scenario: dict[str, Any], ceiling: dict[str, Any]) -> str:
    """What the ratio hides: the ceiling's median round (its best is the bound), the
    forward pass inside the worker against alone, and the worker's event-loop share."""
    t = scenario["throughput"]
    parts = []
    rounds = sorted(r for r in ceiling["forward"].get("rounds", []) if r)
    if rounds:
        median = rounds[len(rounds) // 2]
        parts.append(f"{t['throughput_rps'] / median:.2f} of the ceiling's median round "
                     f"({median:,.1f}/s; rounds {rounds[0]:,.1f}-{rounds[-1]:,.1f})")
    compute = t.get("time_split", {}).get("mean_compute_ms")
    if compute:
        parts.append(f"forward {compute:.1f} ms per batch in the worker vs "
                     f"{ceiling['forward']['ms_per_batch']:.1f} ms alone")
    threads = t.get("worker_threads") or {}
    if threads:
        parts.append(f"worker event loop busy {threads['loop_busy_frac']:.2f} cores, "
                     f"compute threads {threads['compute_threads_frac']:.2f}")
    return "".join(f"; {p}" for p in parts)


def evaluate(report: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    ceilings = report.get("ceilings", {})
    for transport in ("redis", "kafka"):
        enc = _scenario(report, "demo-encoder", transport)
        ceiling = ceilings.get("demo-encoder")
        if enc and ceiling:
            e2e = _num(enc["throughput"]["throughput_rps"])
            alone = _num(ceiling["forward"]["samples_per_s"])
            out.append(Target(
                f"demo-encoder e2e / model-alone ceiling ({transport})",
                round(e2e / alone, 3), ENCODER_VS_CEILING[transport], "min", "x",
                f"{e2e:,.1f} vs {alone:,.1f} req/s at batch {ceiling['batch_size']}"
                + encoder_cause(enc, ceiling)))
    mlp = _scenario(report, "demo-mlp", "redis")
    rq = report.get("naive_rq", {}).get("fastest")
    if mlp and rq:
        e2e = _num(mlp["throughput"]["throughput_rps"])
        out.append(Target(
            "demo-mlp e2e over Redis / naive RQ", round(e2e / _num(rq["jobs_per_s"]), 2),
            MLP_VS_RQ,
            "min", "x", f"{e2e:,.1f} vs {rq['jobs_per_s']:,.1f} req/s "
            f"({rq['worker_class']}, {rq['workers']} worker)"))
    loop = report.get("broker_loop", {}).get("redis")
    if mlp and loop and not loop.get("skipped"):
        e2e = _num(mlp["throughput"]["throughput_rps"])
        limit = _num(loop["msgs_per_s"])
        out.append(Target(
            "demo-mlp e2e over Redis / broker-only loop", round(e2e / limit, 3)
            if limit else math.nan, MLP_VS_BROKER_LOOP, "min", "x",
            f"{e2e:,.1f} vs {limit:,.1f} msg/s (XADD / XREADGROUP / XACK+XDEL, "
            f"{loop['payload_bytes']} B payloads, batch {loop['batch_size']})"))
    for transport in ("redis", "kafka"):
        s = _scenario(report, "demo-mlp", transport)
        if not s:
            continue
        goal = s["max_wait_ms"] + P99_SLACK_MS
        coalesced = s.get("latency_coalesced")
        if coalesced and coalesced["load"] == 0.5:
            out.append(Target(
                f"demo-mlp caller-side p99 at 50%, submit_many producers ({transport})",
                _num(coalesced["latency"]["p99_ms"]), goal, "max", "ms",
                f"offered {coalesced['offered_rps']:,.0f} req/s; arrivals due together sent "
                f"in one submit_many per tick; fleet-side p99 "
                f"{_num(coalesced.get('latency_fleet', {}).get('p99_ms')):.3g} ms; "
                f"max_wait_ms {s['max_wait_ms']:g}"))
        half = next((p for p in s["latency"] if p["load"] == 0.5), None)
        if half:
            out.append(Target(
                f"demo-mlp caller-side p99 at 50%, one submit() per arrival ({transport})",
                _num(half["latency"]["p99_ms"]), PER_ARRIVAL_P99_MS, "max", "ms",
                f"offered {half['offered_rps']:,.0f} req/s; fleet-side p99 "
                f"{_num(half.get('latency_fleet', {}).get('p99_ms')):.3g} ms; client CPU "
                f"{_num(half.get('client_cpu_us_per_request')):.3g} us/request"))
        over = s["throughput"]["worker_overhead_us_per_request"]
        out.append(Target(
            f"worker CPU per request outside the model, demo-mlp ({transport})",
            _num(over["as_specified"]), OVERHEAD_GOAL_US, "max", "us",
            f"(worker CPU - sum of compute_ms) / requests at saturation; "
            f"{_num(over['cpu_corrected']):g} us charging compute at its CPU/wall ratio"))
    out += _kafka_parity(report)
    slo = report.get("sweep_slo")
    if slo and not slo.get("skipped"):
        goal = _num(slo["latency_slo_ms"])
        out.append(Target(
            f"SLO row: fleet-side p99 at every load (--latency-slo-ms {goal:g})",
            _num(slo.get("max_fleet_p99_ms")), goal, "max", "ms",
            "worst of " + ", ".join(f"{p['load']:.0%}: {_num(p['fleet_p99_ms']):.3g}"
                                    + _overloaded(p) for p in slo["points"])
            + f" ms; saturation {_num(slo['throughput_rps']):,.0f} req/s = "
            f"{_num(slo.get('throughput_vs_best_fixed')):.2f}x the best fixed setting"))
    out += _cache_targets(report.get("cache_bulk"))
    tracing = report.get("tracing_unset")
    if tracing and not tracing.get("skipped"):
        out.append(Target(
            "tracing with OTEL_* unset: added per request", _num(tracing["us_per_request"]),
            TRACING_UNSET_US, "max", "us",
            f"worker: {'a' if tracing['worker_tracing_layer'] else 'no'} tracing middleware "
            f"installed; client: one check per request, "
            f"{_num(tracing['client_us_per_request']):.3g} us (timeit)"))
    return out


def _kafka_parity(report: dict[str, Any]) -> list[Target]:
    """Issue 31: Kafka's caller p99 (``submit_many`` at 50%) and worker CPU outside the
    model within 1.5x of Redis's; for the p99, or of the Kafka broker-only loop's p99 where
    Tansu's own latency is the floor (the larger of the two is the reference)."""
    redis, kafka = _scenario(report, "demo-mlp", "redis"), _scenario(report, "demo-mlp", "kafka")
    if not redis or not kafka:
        return []
    out = []
    r_half, k_half = redis.get("latency_coalesced"), kafka.get("latency_coalesced")
    if r_half and k_half:
        r99, k99 = _num(r_half["latency"]["p99_ms"]), _num(k_half["latency"]["p99_ms"])
        loop = report.get("broker_loop", {}).get("kafka") or {}
        floor = _num((loop.get("latency_ms") or {}).get("p99"))
        reference = max(r99, floor) if math.isfinite(floor) else r99
        out.append(Target(
            "Kafka / Redis caller-side p99 at 50%, submit_many producers (demo-mlp)",
            round(k99 / reference, 2) if reference else math.nan, KAFKA_PARITY, "max", "x",
            f"{k99:,.1f} vs {r99:,.1f} ms over Redis; the Kafka broker-only loop's p99 "
            + (f"{floor:,.1f} ms" if math.isfinite(floor) else "not measured")
            + "; the larger is the reference"))
    r_cpu = _num(redis["throughput"]["worker_overhead_us_per_request"]["as_specified"])
    k_cpu = _num(kafka["throughput"]["worker_overhead_us_per_request"]["as_specified"])
    out.append(Target(
        "Kafka / Redis worker CPU per request outside the model (demo-mlp)",
        round(k_cpu / r_cpu, 2) if r_cpu else math.nan, KAFKA_PARITY, "max", "x",
        f"{k_cpu:g} vs {r_cpu:g} us at saturation"))
    return out


#: A load step whose achieved rate fell short of the offered one by more than this share was
#: past what the machine carried (fleet and producers together), not a controller's choice.
OVERLOADED_BELOW = 0.97


def _overloaded(point: dict[str, Any]) -> str:
    """`` (overloaded: achieved A of O req/s)`` for a step the machine could not carry: the
    SLO row's loads are shares of a closed-loop saturation, and open-loop producers cost
    the shared cores more per request than the closed loop's."""
    offered, achieved = _num(point.get("offered_rps")), _num(point.get("achieved_rps"))
    if offered > 0 and achieved < OVERLOADED_BELOW * offered:
        return f" (overloaded: achieved {achieved:,.0f} of {offered:,.0f} req/s)"
    return ""


def _cache_targets(row: dict[str, Any] | None) -> list[Target]:
    if not row or row.get("skipped") or row.get("speedup") is None:
        return []
    ratio = _num(row.get("hit_ratio"))
    same = "identical" if row.get("identical_outputs") else (
        f"NOT identical (max abs diff {_num(row.get('max_abs_diff')):.3g})")
    return [
        Target("cache bulk row: cache on / off", _num(row["speedup"]), CACHE_SPEEDUP, "min",
               "x", f"{row['rows']:,} demo-encoder rows, {row['repeats']:,} repeats; "
               f"{row['cache_on']['rows_per_s']:,.1f} vs {row['cache_off']['rows_per_s']:,.1f} "
               f"rows/s; outputs {same}"),
        Target("cache bulk row: rows whose outputs differ, cache on vs off",
               _num(row.get("differing_rows")), 0, "max", "rows",
               f"outputs {same}; bit-for-bit comparison of the two runs' .npy outputs"),
        Target("cache bulk row: hit ratio off 50%", round(abs(ratio - 0.5) * 100, 2),
               CACHE_HIT_SLACK_PP, "max", "pp",
               f"hit ratio {ratio:.2%} (hits and in-batch coalesced / cache-enabled requests)"),
    ]
