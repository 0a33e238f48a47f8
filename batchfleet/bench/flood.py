"""Failure isolation, measured: demo-mlp latency while bad demo-encoder traffic floods
the same worker.

One worker serves both models. demo-mlp gets an open-loop Poisson load twice:
once alone, once while a steady flood of demo-encoder requests with token IDs
outside the vocabulary arrives (40/s by default, the rate that once paused
every model on the worker). The flood must fail at intake, once per request,
so demo-mlp's p99 should barely move and no breaker should open.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.open_loop import open_loop
from batchfleet.bench.plan import FloodPlan
from batchfleet.bench.procstat import CpuMeter
from batchfleet.bench.samples import latency_summary
from batchfleet.connectors import open_control_plane
from batchfleet.demo import demo_inputs
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN, ENCODER_VOCAB


def bad_encoder_inputs(count: int, seed: int) -> np.ndarray[Any, Any]:
    """demo-encoder rows each holding one token ID at or past the vocabulary."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, ENCODER_VOCAB, (count, ENCODER_SEQ_LEN), dtype=np.int64)
    rows[:, 0] = ENCODER_VOCAB + rng.integers(0, 10_000, count)
    return rows


async def _flood(client: AsyncClient, rate: float, seconds: float, seed: int
                 ) -> dict[str, Any]:
    """Submit bad encoder requests one at a time at ``rate``/s; then tally their results."""
    rows = bad_encoder_inputs(max(1, int(rate * seconds)), seed)
    ids: list[str] = []
    start = time.monotonic()
    for i, row in enumerate(rows):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        ids.append(await client.submit("demo-encoder", row))
    results = await client.wait_many(ids, timeout=120)
    return {"submitted": len(ids),
            "statuses": dict(Counter(r.status for r in results)),
            "error_types": dict(Counter(r.error.type for r in results if r.error)),
            "max_attempts": max((r.attempts for r in results), default=0)}


async def _heartbeat(redis_url: str, namespace: str, worker_id: str) -> dict[str, Any]:
    plane = open_control_plane(redis_url, namespace=namespace)
    try:
        records = await plane.heartbeats.read_all()
    finally:
        await plane.close()
    record = next((r for r in records if r.worker_id == worker_id), None)
    if record is None:
        return dict.fromkeys(("model_breakers", "lane_pauses", "breakers", "retried",
                              "dead_lettered"))
    return {"model_breakers": record.extra.get("model_breakers"),
            "lane_pauses": record.extra.get("lane_pauses"), "breakers": record.breakers,
            "retried": record.counters["retried"],
            "dead_lettered": record.counters["dead_lettered"]}


async def _drive(broker: str, results: str, namespace: str, plan: FloodPlan, meter: CpuMeter,
                 seed: int, worker_id: str) -> dict[str, Any]:
    inputs = demo_inputs("demo-mlp", 4096, seed)
    rng = np.random.default_rng(seed)
    async with AsyncClient(broker, results, namespace=namespace, poll_interval_s=30.0) as client:
        await client.wait_many(await client.submit_many("demo-mlp", inputs[:128]), 90.0)

        async def mlp_phase() -> dict[str, Any]:
            run = await open_loop(client, "demo-mlp", inputs, rate=plan.mlp_rps,
                                  duration_s=plan.seconds, meter=meter, rng=rng)
            return {"completed": len(run.samples),
                    "statuses": dict(Counter(s.status for s in run.samples)),
                    "latency": latency_summary(run.samples)}

        alone = await mlp_phase()
        flooded, flood = await asyncio.gather(
            mlp_phase(), _flood(client, plan.flood_rps, plan.seconds, seed))
    return {"mlp_alone": alone, "mlp_with_flood": flooded, "flood": flood,
            "worker": await _heartbeat(results, namespace, worker_id)}


def run_flood(svc: fleet.Services, plan: FloodPlan, seed: int) -> dict[str, Any]:
    """Start one worker serving demo-mlp and demo-encoder, and measure both phases."""
    namespace = fleet.new_namespace(f"flood-{plan.transport}")
    proc = WorkerProcess(
        svc.broker_for(plan.transport), svc.redis_url, models=("demo-mlp", "demo-encoder"),
        namespace=namespace, log_level="warning", env=dict(svc.worker_env), keep_log=False,
        device="auto",
        extra_args=("--max-batch-size", str(plan.max_batch_size),
                    "--max-wait-ms", str(plan.max_wait_ms)))
    started = time.time()
    with proc:
        proc.wait_ready()
        assert proc.proc is not None
        meter = CpuMeter({"worker": proc.proc.pid, "client": os.getpid(),
                          **svc.server_pids()})
        body = asyncio.run(_drive(svc.broker_for(plan.transport), svc.redis_url, namespace,
                                  plan, meter, seed, proc.worker_id))
    return {"transport": plan.transport, "mlp_rps": plan.mlp_rps,
            "flood_rps": plan.flood_rps, "seconds": plan.seconds,
            "elapsed_s": round(time.time() - started, 1), **body}


def flood_table(report: dict[str, Any]) -> str:
    """The isolation section of bench.md."""
    f = report["flood"]
    alone, flooded = f["mlp_alone"]["latency"], f["mlp_with_flood"]["latency"]
    lines = [
        f"demo-mlp at {f['mlp_rps']:g} req/s over {f['transport']}, {f['seconds']:g} s per "
        f"phase; flood: {f['flood_rps']:g} bad demo-encoder req/s (token IDs >= vocab) on "
        "the same worker.\n",
        "| demo-mlp | p50 ms | p99 ms | max ms | completed |",
        "|---|---:|---:|---:|---:|",
        f"| alone | {alone['p50_ms']} | {alone['p99_ms']} | {alone['max_ms']} | "
        f"{f['mlp_alone']['completed']} |",
        f"| with flood | {flooded['p50_ms']} | {flooded['p99_ms']} | {flooded['max_ms']} | "
        f"{f['mlp_with_flood']['completed']} |",
        "",
        f"Flood: {f['flood']['submitted']} requests, statuses {f['flood']['statuses']}, "
        f"error types {f['flood']['error_types']}, at most {f['flood']['max_attempts']} "
        f"attempt(s). Worker after: breakers {f['worker'].get('model_breakers')}, lane "
        f"pauses {f['worker'].get('lane_pauses')}.",
    ]
    return "\n".join(lines)
