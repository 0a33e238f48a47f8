"""The output statistics' cost: demo-mlp's end-to-end throughput with them off and on.

The statistics are on by default (docs/monitoring.md), so their cost must stay under 2%
of throughput. The same closed-loop scenario runs against a fresh worker with
``--no-output-stats`` and without it, alternating off/on ``rounds`` times in one bench
run (same servers, same producers' code, same machine state), and the cost is
``1 - median(on) / median(off)``; a negative cost is noise. When the worker has no such
option yet the row records why and is skipped.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from batchfleet.bench.fleet import Services
from batchfleet.bench.plan import DEFAULT_MODEL_PLANS, StatsCostPlan
from batchfleet.bench.scenario import Phases, run_scenario
from batchfleet.bench.sweep import worker_option_missing


def cost_of(off: list[float], on: list[float]) -> float:
    """The throughput lost with the statistics on, as a share of it with them off."""
    return 1.0 - statistics.median(on) / statistics.median(off)


def run_stats_cost(svc: Services, plan: StatsCostPlan, phases: Phases, *,
                   model_cpu_per_wall: float, seed: int) -> dict[str, Any]:
    row: dict[str, Any] = {"model": "demo-mlp", "transport": plan.transport,
                           "rounds": plan.rounds, "limit": plan.limit}
    missing = worker_option_missing("output_stats", "--no-output-stats")
    if missing is not None:
        return {**row, "skipped": missing}
    model = DEFAULT_MODEL_PLANS["demo-mlp"]
    closed_only = replace(phases, loads=(), coalesced_load=None, coalesced_loads=())
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(plan.rounds):
        for side, args in (("off", ("--no-output-stats",)), ("on", ())):
            record = run_scenario(svc, plan.transport, model, closed_only,
                                  model_cpu_per_wall=model_cpu_per_wall, seed=seed,
                                  worker_args=args)
            runs[side].append(record["throughput"]["throughput_rps"])
    cost = cost_of(runs["off"], runs["on"])
    return {**row, "off_rps": runs["off"], "on_rps": runs["on"],
            "off_median_rps": round(statistics.median(runs["off"]), 1),
            "on_median_rps": round(statistics.median(runs["on"]), 1),
            "cost": round(cost, 4), "within_limit": cost <= plan.limit}
