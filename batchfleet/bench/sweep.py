"""The max_batch_size x max_wait_ms sweep: what each setting buys in throughput and costs in p99.

Each grid point gets its own worker: a short closed loop finds its saturation
throughput, then an open loop at a fixed fraction of *that* (the plan's
``load``) gives its p99. Plotted together they show the trade-off curve. The
SLO row (``run_slo_row``) lets the worker choose under ``--latency-slo-ms``.
"""

from __future__ import annotations

from dataclasses import fields, replace
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
                "fleet_p99_ms": opened["latency_fleet"]["p99_ms"],
                "mean_batch_size": opened["mean_batch_size"],
            })
    return points


def worker_option_missing(setting: str, flag: str) -> str | None:
    """Why the worker cannot take ``flag`` (its settings have no ``setting``), or None."""
    try:
        from batchfleet.workers.settings import WorkerSettings

        names = {f.name for f in fields(WorkerSettings)}
    except Exception as exc:  # a settings module mid-edit must not stop the bench
        return f"cannot read the worker's settings ({type(exc).__name__}: {exc})"
    if setting not in names:
        return f"this worker has no {flag} option yet (no {setting!r} setting)"
    return None


def run_slo_row(svc: Services, plan: SweepPlan, phases: Phases, points: list[dict[str, Any]],
                *, model_cpu_per_wall: float, seed: int) -> dict[str, Any]:
    """The sweep's SLO row: the worker picks batch and wait itself under ``--latency-slo-ms``.

    Saturation throughput is compared with the best fixed setting of the grid, and the
    fleet-side p99 (enqueue to ``finished_at``) is taken at each load from 10% to 80%
    of this worker's own saturation, with ``submit_many`` producers. When the worker has
    no such option yet the row records why and is skipped.
    """
    slo = plan.slo
    assert slo is not None
    row: dict[str, Any] = {"latency_slo_ms": slo.latency_slo_ms,
                           "max_batch_size": slo.max_batch_size, "max_wait_ms": slo.max_wait_ms,
                           "loads": list(slo.loads)}
    missing = worker_option_missing("latency_slo_ms", "--latency-slo-ms")
    if missing is not None:
        return {**row, "skipped": missing}
    base = DEFAULT_MODEL_PLANS[plan.model]
    chunk = max(slo.max_batch_size, 128)
    model_plan = replace(base, max_batch_size=slo.max_batch_size, max_wait_ms=slo.max_wait_ms,
                         chunk=chunk, chunks_in_flight=max(4, 2048 // chunk))
    try:
        record = run_scenario(
            svc, plan.transport, model_plan,
            replace(phases, loads=(), coalesced_load=None, coalesced_loads=slo.loads),
            model_cpu_per_wall=model_cpu_per_wall, seed=seed,
            worker_args=("--latency-slo-ms", f"{slo.latency_slo_ms:g}"))
    except Exception as exc:  # the option may exist but not work yet: note it, go on
        return {**row, "skipped": f"SLO worker failed: {type(exc).__name__}: {exc}"[:500]}
    best = max(points, key=lambda p: p["throughput_rps"], default=None)
    saturation = record["throughput"]["throughput_rps"]
    loads = [{
        "load": p["load"], "offered_rps": p["offered_rps"], "achieved_rps": p["achieved_rps"],
        "fleet_p50_ms": p["latency_fleet"]["p50_ms"], "fleet_p95_ms": p["latency_fleet"]["p95_ms"],
        "fleet_p99_ms": p["latency_fleet"]["p99_ms"], "caller_p99_ms": p["latency"]["p99_ms"],
        "mean_batch_size": p["mean_batch_size"],
    } for p in record.get("latency_coalesced_loads", [])]
    p99s = [p["fleet_p99_ms"] for p in loads if isinstance(p["fleet_p99_ms"], int | float)]
    return {
        **row, "throughput_rps": saturation,
        "saturation_mean_batch_size": record["throughput"]["mean_batch_size"],
        "best_fixed": ({"max_batch_size": best["max_batch_size"],
                        "max_wait_ms": best["max_wait_ms"],
                        "throughput_rps": best["throughput_rps"]} if best else None),
        "throughput_vs_best_fixed": (round(saturation / best["throughput_rps"], 3)
                                     if best and best["throughput_rps"] else None),
        "points": loads,
        "max_fleet_p99_ms": max(p99s) if p99s else None,
    }
