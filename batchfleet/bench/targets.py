"""The issue's targets, checked against one run's numbers: met or missed, and by how much.

Targets are ratios within one run (so the machine's speed cancels out) plus
two absolute goals: demo-mlp p99 at half load, and the worker's CPU per
request outside the model. Nothing here measures; it only compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ENCODER_VS_CEILING = 0.90
MLP_VS_RQ = 30.0
P99_SLACK_MS = 10.0
OVERHEAD_GOAL_US = 15.0


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
                round(e2e / alone, 3), ENCODER_VS_CEILING, "min", "x",
                f"{e2e:,.1f} vs {alone:,.1f} req/s at batch {ceiling['batch_size']}"))
    mlp = _scenario(report, "demo-mlp", "redis")
    rq = report.get("naive_rq", {}).get("fastest")
    if mlp and rq:
        e2e = _num(mlp["throughput"]["throughput_rps"])
        out.append(Target(
            "demo-mlp e2e over Redis / naive RQ", round(e2e / _num(rq["jobs_per_s"]), 2),
            MLP_VS_RQ,
            "min", "x", f"{e2e:,.1f} vs {rq['jobs_per_s']:,.1f} req/s "
            f"({rq['worker_class']}, {rq['workers']} worker)"))
    for transport in ("redis", "kafka"):
        s = _scenario(report, "demo-mlp", transport)
        half = next((p for p in s["latency"] if p["load"] == 0.5), None) if s else None
        if s and half:
            goal = s["max_wait_ms"] + P99_SLACK_MS
            out.append(Target(
                f"demo-mlp p99 at 50% of saturation ({transport})",
                _num(half["latency"]["p99_ms"]),
                goal, "max", "ms", f"offered {half['offered_rps']:,.0f} req/s, "
                f"max_wait_ms {s['max_wait_ms']:g}"))
        coalesced = s.get("latency_coalesced") if s else None
        if s and coalesced and coalesced["load"] == 0.5:
            out.append(Target(
                f"demo-mlp p99 at 50%, coalesced submits ({transport}; diagnostic)",
                _num(coalesced["latency"]["p99_ms"]), s["max_wait_ms"] + P99_SLACK_MS, "max",
                "ms", "same load, arrivals due together sent in one submit_many: the fleet "
                "without the SDK's per-request submit cost"))
        if s:
            over = s["throughput"]["worker_overhead_us_per_request"]
            out.append(Target(
                f"worker CPU per request outside the model, demo-mlp ({transport})",
                _num(over["as_specified"]), OVERHEAD_GOAL_US, "max", "us",
                f"(worker CPU - sum of compute_ms) / requests at saturation; "
                f"{_num(over['cpu_corrected']):g} us charging compute at its CPU/wall ratio"))
    return out
