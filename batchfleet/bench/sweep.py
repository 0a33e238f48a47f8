"""The max_batch_size x max_wait_ms sweep: what each setting buys in throughput and costs in p99.

Each grid point gets its own worker: a short closed loop finds its saturation
throughput, then an open loop at a fixed fraction of *that* (the plan's
``load``) gives its p99. Plotted together they show the trade-off curve.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from batchfleet.bench.fleet import Services
from batchfleet.bench.plan import DEFAULT_MODEL_PLANS, SweepPlan
from batchfleet.bench.scenario import Phases, run_scenario


def run_sweep(svc: Services, plan: SweepPlan, phases: Phases, *, model_cpu_per_wall: float,
              seed: int) -> list[dict[str, Any]]:
    base = DEFAULT_MODEL_PLANS[plan.model]
    points = []
    for batch in plan.batch_sizes:
        for wait_ms in plan.waits_ms:
            # Keep the closed loop a few batches deep whatever the batch size, with few
            # enough lanes that the SDK's connection pool (100 in redis-py 8) is not hit.
            chunk = max(batch, 128)
            model_plan = replace(base, max_batch_size=batch, max_wait_ms=wait_ms,
                                 chunk=chunk, chunks_in_flight=max(4, 2048 // chunk))
            coalesced = plan.submit_mode == "coalesced"
            record = run_scenario(
                svc, plan.transport, model_plan,
                replace(phases, loads=() if coalesced else (plan.load,),
                        coalesced_load=plan.load if coalesced else None),
                model_cpu_per_wall=model_cpu_per_wall, seed=seed)
            opened = record["latency_coalesced"] if coalesced else record["latency"][0]
            points.append({
                "max_batch_size": batch, "max_wait_ms": wait_ms,
                "throughput_rps": record["throughput"]["throughput_rps"],
                "saturation_mean_batch_size": record["throughput"]["mean_batch_size"],
                "load": plan.load, "submit_mode": plan.submit_mode,
                "offered_rps": opened["offered_rps"],
                "achieved_rps": opened["achieved_rps"],
                "p50_ms": opened["latency"]["p50_ms"], "p99_ms": opened["latency"]["p99_ms"],
                "mean_batch_size": opened["mean_batch_size"],
            })
    return points
