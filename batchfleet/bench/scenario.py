"""One model on one transport: warm up, saturate, then offer 25/50/80% of that load.

The closed loop measures saturation throughput, the open-loop phases reuse
it to set their Poisson rates, so every latency figure is at a known fraction
of what this fleet, on this machine, in this run, could do.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.closed_loop import ClosedLoopRun, closed_loop
from batchfleet.bench.open_loop import OpenLoopRun, open_loop
from batchfleet.bench.plan import ModelPlan
from batchfleet.bench.procstat import CpuMeter
from batchfleet.bench.samples import batch_totals, latency_summary, time_split
from batchfleet.demo import demo_inputs
from batchfleet.producers import AsyncClient

#: Pool of distinct inputs the scenario cycles through.
_INPUT_POOL = 4096
_WARMUP_TIMEOUT_S = 90.0
#: A profiler context for the worker and one for the client, given their PIDs.
ProfilerFactory = Callable[[int, int], AbstractContextManager[object]]


@dataclass(frozen=True, slots=True)
class Phases:
    """Phase lengths and caps for one scenario (the plan's, or the sweep's shorter ones)."""

    warmup_s: float
    closed_s: float
    open_s: float
    loads: tuple[float, ...]
    max_requests: int | None
    #: Also offer this load with coalesced submits (a diagnostic); None: skip.
    coalesced_load: float | None = None
    #: Repeat a phase (up to ``noise_retries`` times) when other processes used more than
    #: ``noise_cores`` cores during it.
    noise_retries: int = 0
    noise_cores: float = 0.15


def worker_overhead_us(worker_cpu_s: float, compute_s: float, requests: int,
                       model_cpu_per_wall: float) -> dict[str, float]:
    """Worker CPU per request that is not the model, two ways.

    ``as_specified``: worker CPU minus the summed ``compute_ms`` (wall time of the
    compute step), per request. ``cpu_corrected`` charges the compute step at the
    CPU it burns per wall second (measured on the model-alone loop: torch's second
    thread and OpenMP spin-waits make it up to 2x), which is the fairer reading
    when torch uses more than one thread.
    """
    if requests == 0:
        return {"as_specified": float("nan"), "cpu_corrected": float("nan")}
    raw = (worker_cpu_s - compute_s) / requests * 1e6
    corrected = (worker_cpu_s - compute_s * model_cpu_per_wall) / requests * 1e6
    return {"as_specified": round(raw, 2), "cpu_corrected": round(corrected, 2)}


def summarize_closed(run: ClosedLoopRun, model_cpu_per_wall: float) -> dict[str, Any]:
    totals = batch_totals(run.samples)
    worker_cpu = run.cpu_s.get("worker", 0.0)
    return {
        "throughput_rps": round(run.throughput_rps, 1),
        "window_s": round(run.window_s, 3),
        "submitted": run.submitted,
        **totals.as_dict(),
        "time_split": time_split(run.samples),
        "latency": latency_summary(run.samples),
        "cpu_s": run.cpu_s,
        "cpu_util": {k: round(v / run.window_s, 3) for k, v in run.cpu_s.items()}
        if run.window_s > 0 else {},
        "worker_cpu_us_per_request": round(worker_cpu / max(1, totals.requests) * 1e6, 2),
        "worker_overhead_us_per_request": worker_overhead_us(
            worker_cpu, totals.compute_s, totals.requests, model_cpu_per_wall),
        "model_busy_frac": round(totals.compute_s / run.window_s, 3) if run.window_s else 0.0,
    }


def summarize_open(run: OpenLoopRun, load: float, model_cpu_per_wall: float,
                   submit_mode: str = "per-request") -> dict[str, Any]:
    totals = batch_totals(run.samples)
    worker_cpu = run.cpu_s.get("worker", 0.0)
    lag = np.asarray(run.start_lag_ms or [0.0])
    sub = np.asarray(run.submit_ms or [0.0])
    return {
        "load": load,
        "submit_mode": submit_mode,
        "offered_rps": round(run.offered_rps, 1),
        "achieved_rps": round(run.achieved_rps, 1),
        "arrivals": run.arrivals,
        "completed": len(run.samples),
        "statuses": {s: sum(1 for x in run.samples if x.status == s)
                     for s in sorted({x.status for x in run.samples})},
        "latency": latency_summary(run.samples),
        **totals.as_dict(),
        "time_split": time_split(run.samples),
        "submit_ms": {"p50": round(float(np.percentile(sub, 50)), 3),
                      "p99": round(float(np.percentile(sub, 99)), 3)},
        "start_lag_ms": {"p50": round(float(np.percentile(lag, 50)), 3),
                         "p99": round(float(np.percentile(lag, 99)), 3),
                         "max": round(float(lag.max()), 3)},
        "cpu_s": run.cpu_s,
        "cpu_util": {k: round(v / run.wall_s, 3) for k, v in run.cpu_s.items()}
        if run.wall_s > 0 else {},
        "worker_overhead_us_per_request": worker_overhead_us(
            worker_cpu, totals.compute_s, totals.requests, model_cpu_per_wall),
    }


T = TypeVar("T")


def closed_window(run: ClosedLoopRun) -> tuple[dict[str, float], float]:
    return run.cpu_s, run.window_s


def open_window(run: OpenLoopRun) -> tuple[dict[str, float], float]:
    return run.cpu_s, run.wall_s


async def _quiet(phases: Phases, measure: Callable[[], Awaitable[T]],
                 window: Callable[[T], tuple[dict[str, float], float]]) -> tuple[T, int]:
    """Run a phase; repeat it while something outside the bench was busy during it.

    The machine may be shared. A window in which other processes used more than
    ``phases.noise_cores`` cores measured them as much as the fleet, so it is thrown
    away and run again, up to ``phases.noise_retries`` times; the last one is kept
    either way, and ``tries`` records how many it took.
    """
    tries = 0
    while True:
        tries += 1
        result = await measure()
        cpu_s, wall_s = window(result)
        other = cpu_s.get("other", 0.0) / wall_s if wall_s > 0 else 0.0
        if other <= phases.noise_cores or tries > phases.noise_retries:
            return result, tries


async def _warm_up(client: AsyncClient, plan: ModelPlan, inputs: np.ndarray[Any, Any]) -> None:
    """A few full batches end to end: a Kafka group join and lazy paths happen here."""
    ids = await client.submit_many(plan.model, inputs[: plan.max_batch_size * 2])
    await client.wait_many(ids, _WARMUP_TIMEOUT_S)


async def drive(broker: str, results: str, namespace: str, plan: ModelPlan, phases: Phases,
                meter: CpuMeter, model_cpu_per_wall: float, seed: int,
                profiler: ProfilerFactory | None, worker_pid: int) -> dict[str, Any]:
    inputs = demo_inputs(plan.model, _INPUT_POOL, seed)
    rng = np.random.default_rng(seed)
    # A long safety poll: the open loop registers thousands of not-yet-submitted IDs,
    # and re-reading all of them every second would load the client, not the fleet.
    async with AsyncClient(broker, results, namespace=namespace, poll_interval_s=30.0) as client:
        await _warm_up(client, plan, inputs)
        closed, tries = await _quiet(phases, lambda: closed_loop(
            client, plan.model, inputs, chunk=plan.chunk, lanes=plan.chunks_in_flight,
            warmup_s=phases.warmup_s, duration_s=phases.closed_s, meter=meter,
            max_requests=phases.max_requests), closed_window)
        saturation = closed.throughput_rps
        out: dict[str, Any] = {
            "throughput": {**summarize_closed(closed, model_cpu_per_wall), "tries": tries},
            "latency": []}

        def offer(load: float, coalesce: bool) -> Callable[[], Awaitable[OpenLoopRun]]:
            return lambda: open_loop(
                client, plan.model, inputs, rate=max(1.0, saturation * load),
                duration_s=phases.open_s, meter=meter, rng=rng,
                max_requests=phases.max_requests, coalesce=coalesce)

        for load in phases.loads:
            run, tries = await _quiet(phases, offer(load, False), open_window)
            out["latency"].append({**summarize_open(run, load, model_cpu_per_wall),
                                   "tries": tries})
        if phases.coalesced_load is not None:
            run, tries = await _quiet(phases, offer(phases.coalesced_load, True), open_window)
            out["latency_coalesced"] = {
                **summarize_open(run, phases.coalesced_load, model_cpu_per_wall, "coalesced"),
                "tries": tries}
        if profiler is not None:
            out["profile_run"] = await _profiled(client, plan, inputs, phases, meter, rng,
                                                 saturation, profiler, worker_pid)
    return out


async def _profiled(client: AsyncClient, plan: ModelPlan, inputs: np.ndarray[Any, Any],
                    phases: Phases, meter: CpuMeter, rng: np.random.Generator,
                    saturation: float, profiler: ProfilerFactory, worker_pid: int
                    ) -> dict[str, Any]:
    """Extra passes under py-spy (it slows what it samples, so nothing here is a result)."""
    with profiler(worker_pid, os.getpid()):
        closed = await closed_loop(
            client, plan.model, inputs, chunk=plan.chunk, lanes=plan.chunks_in_flight,
            warmup_s=0.0, duration_s=phases.closed_s, meter=meter)
        opened = await open_loop(client, plan.model, inputs, rate=max(1.0, saturation * 0.5),
                                 duration_s=phases.open_s, meter=meter, rng=rng)
    return {"closed_throughput_rps": round(closed.throughput_rps, 1),
            "open_achieved_rps": round(opened.achieved_rps, 1)}


def run_scenario(svc: fleet.Services, transport: str, plan: ModelPlan, phases: Phases, *,
                 model_cpu_per_wall: float, seed: int,
                 profiler: ProfilerFactory | None = None) -> dict[str, Any]:
    """Start a worker for ``plan`` on ``transport`` and measure it; the scenario's record."""
    namespace = fleet.new_namespace(f"{plan.model}-{transport}")
    started = time.time()
    with fleet.worker(svc, transport, plan.model, plan.max_batch_size, plan.max_wait_ms,
                      namespace) as proc:
        assert proc.proc is not None
        meter = CpuMeter({"worker": proc.proc.pid, "client": os.getpid(),
                          **svc.server_pids()})
        body = asyncio.run(drive(svc.broker_for(transport), svc.redis_url, namespace, plan,
                                 phases, meter, model_cpu_per_wall, seed, profiler,
                                 proc.proc.pid))
    return {"model": plan.model, "transport": transport,
            "max_batch_size": plan.max_batch_size, "max_wait_ms": plan.max_wait_ms,
            "closed_loop_window": plan.chunk * plan.chunks_in_flight,
            "elapsed_s": round(time.time() - started, 1), **body}
