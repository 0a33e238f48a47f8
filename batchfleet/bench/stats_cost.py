"""The output statistics' cost: demo-mlp's end-to-end throughput with them off and on.

The statistics are on by default (docs/monitoring.md), so their cost must stay under 2%
of throughput. The same closed-loop scenario runs against a fresh worker with
``--no-output-stats`` and without it, alternating off/on ``rounds`` times in one bench
run (same servers, same producers' code, same machine state), and the cost is
``1 - median(on) / median(off)``; a negative cost is noise. Throughput on a shared
machine moves by more than 2% from run to run, so the row also records the worker's CPU
per request in each run (far less sensitive to other load) and the statistics' own CPU
per request, timed in process on demo-mlp-shaped batches (:func:`summary_us_per_request`).
When the worker has no such option yet the row records why and is skipped.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np

from batchfleet.bench.fleet import Services
from batchfleet.bench.plan import DEFAULT_MODEL_PLANS, StatsCostPlan
from batchfleet.bench.scenario import Phases, run_scenario
from batchfleet.bench.sweep import worker_option_missing


def cost_of(off: list[float], on: list[float]) -> float:
    """The throughput lost with the statistics on, as a share of it with them off."""
    return 1.0 - statistics.median(on) / statistics.median(off)


def summary_us_per_request(batch: int = 256, batches: int = 400) -> float:
    """CPU µs per request the statistics add to a worker: what ``after_compute`` does per
    batch (``counted``, ``record``), then the summaries and the flush's field encoding, on
    demo-mlp-shaped requests (inputs decoded as the worker decodes a fetch)."""
    from batchfleet.connectors.output_summary import to_fields
    from batchfleet.schemas.batch_decode import decode_batch
    from batchfleet.schemas.envelopes import Request, encode_request
    from batchfleet.workers.jobs import Job
    from batchfleet.workers.middleware.base import Batch, BatchKey
    from batchfleet.workers.middleware.output_stats import OutputStats, counted
    from batchfleet.workers.runner import BatchRun

    rng = np.random.default_rng(0)
    payloads = [encode_request(Request(f"r{i}", "demo-mlp", row)) for i, row in
                enumerate(rng.standard_normal((batch, 10)).astype(np.float32))]
    requests = decode_batch(payloads)
    jobs = [Job(None, r) for r in requests if isinstance(r, Request)]  # type: ignore[arg-type]
    one = Batch(BatchKey(0, "demo-mlp", None), jobs)
    run = BatchRun(list(rng.random((batch, 1), dtype=np.float32)), 0.0, 0.0, 1)
    mw = OutputStats(max_pending=batches)  # every fold counted, none left out as behind
    began = time.process_time()
    for _ in range(batches):
        outs, ins = counted(one, run)
        mw.record("demo-mlp", "default", outs, ins, now=0.0)
    for _, flush in asyncio.run(mw.take()):
        for summary in flush.deltas.values():
            to_fields(summary)
    return (time.process_time() - began) / (batch * batches) * 1e6


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
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(plan.rounds):
        for side, args in (("off", ("--no-output-stats",)), ("on", ())):
            record = run_scenario(svc, plan.transport, model, closed_only,
                                  model_cpu_per_wall=model_cpu_per_wall, seed=seed,
                                  worker_args=args)
            runs[side].append(record["throughput"]["throughput_rps"])
            cpu[side].append(record["throughput"]["worker_cpu_us_per_request"])
    cost = cost_of(runs["off"], runs["on"])
    summary_us = summary_us_per_request()
    worker_us = statistics.median(cpu["off"])
    return {**row, "off_rps": runs["off"], "on_rps": runs["on"],
            "off_median_rps": round(statistics.median(runs["off"]), 1),
            "on_median_rps": round(statistics.median(runs["on"]), 1),
            "cost": round(cost, 4), "within_limit": cost <= plan.limit,
            "off_worker_cpu_us": cpu["off"], "on_worker_cpu_us": cpu["on"],
            "summary_us_per_request": round(summary_us, 3),
            "summary_share_of_worker_cpu": round(summary_us / worker_us, 4)
            if worker_us else None}
