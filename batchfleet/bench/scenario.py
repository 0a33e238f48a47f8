"""One model on one transport: warm up, saturate, then offer 25/50/80% of that load.

Load comes from ``Phases.producers`` separate processes (``batchfleet.bench.load``).

The closed loop measures saturation throughput, the open-loop phases reuse
it to set their Poisson rates, so every latency figure is at a known fraction
of what this fleet, on this machine, in this run, could do.

Over Kafka each open-loop phase runs on fresh topics, with its own worker and producers
(``fresh_log``): Tansu's in-memory engine, the bench's broker, spends CPU on a fetch in
proportion to the record batches already in the topic (at a steady 3,300 messages/s
with one consumer it went from 0.11 to 0.96 of a core in 20 s, and a new topic started
cheap again), so a phase that followed the closed loop measured Tansu's growing log
more than the fleet. A Kafka broker finds an offset by its index, whatever the log's
length.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.closed_loop import ClosedLoopRun
from batchfleet.bench.load import DEFAULT_PRODUCERS, Producers
from batchfleet.bench.open_loop import OpenLoopRun
from batchfleet.bench.plan import ModelPlan
from batchfleet.bench.procstat import CpuMeter
from batchfleet.bench.samples import batch_totals, client_stages, latency_summary, time_split
from batchfleet.demo import demo_inputs

#: Pool of distinct inputs the scenario cycles through.
_INPUT_POOL = 4096
#: A profiler context for the worker and one for the client, given their PIDs.
ProfilerFactory = Callable[[int, int], AbstractContextManager[object]]
#: A fresh rig for one phase: producers and the CPU meter, on a namespace of its own.
FreshRig = Callable[[], AbstractContextManager[tuple[Producers, CpuMeter]]]


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
    #: Load-generating producer processes (``batchfleet.bench.load``).
    producers: int = DEFAULT_PRODUCERS
    #: Open-loop loads offered with coalesced (``submit_many`` per tick) submits, each a
    #: phase of its own (the SLO row's 10%-80% ramp); recorded as ``latency_coalesced_loads``.
    coalesced_loads: tuple[float, ...] = ()


def worker_overhead_us(worker_cpu_s: float, compute_s: float, requests: int,
                       model_cpu_per_wall: float) -> dict[str, float | None]:
    """Worker CPU per request that is not the model, two ways.

    ``as_specified``: worker CPU minus the summed ``compute_ms`` (wall time of the
    compute step), per request. ``cpu_corrected`` charges the compute step at the
    CPU it burns per wall second (measured on the model-alone loop: torch's second
    thread and OpenMP spin-waits make it up to 2x), which is the fairer reading
    when torch uses more than one thread.

    None where the reading is not a measurement: no requests, or a difference below
    zero. Worker CPU can only fall below the compute step's wall time when the step was
    descheduled (a shared machine), and the subtraction then says nothing about
    overhead: the report shows "-" rather than a negative cost.
    """
    if requests == 0:
        return {"as_specified": None, "cpu_corrected": None}
    raw = (worker_cpu_s - compute_s) / requests * 1e6
    corrected = (worker_cpu_s - compute_s * model_cpu_per_wall) / requests * 1e6
    return {"as_specified": round(raw, 2) if raw >= 0 else None,
            "cpu_corrected": round(corrected, 2) if corrected >= 0 else None}


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
        "client_cpu_us_per_request": round(run.client_cpu_us_per_request, 2),
        "model_busy_frac": round(totals.compute_s / run.window_s, 3) if run.window_s else 0.0,
        "worker_threads": thread_fractions(run.worker_threads),
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
        "latency_fleet": latency_summary(run.samples, fleet=True),
        **totals.as_dict(),
        "time_split": time_split(run.samples),
        "client_cpu_us_per_request": round(run.client_cpu_us_per_request, 2),
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
        "worker_threads": thread_fractions(run.worker_threads),
        "client_stages": client_stages(run.samples),
    }


def thread_fractions(split: dict[str, float]) -> dict[str, float]:
    """The worker's thread split as shares of its window's wall time (cores).

    ``loop_busy_frac`` is the event loop's thread on a CPU; ``loop_wait_frac`` is it
    runnable but waiting for a CPU (so busy + wait is the share of the window the loop
    had work); ``compute_threads_frac`` is every other thread on a CPU (the compute
    thread and torch's intra-op threads: up to the torch thread count). Empty when the
    split could not be read (a worker thread exited in the window).
    """
    window_s = split.get("wall_s", 0.0)
    if window_s <= 0:
        return {}
    return {"loop_busy_frac": round(split["loop_cpu_s"] / window_s, 3),
            "loop_wait_frac": round(split["loop_wait_s"] / window_s, 3),
            "compute_threads_frac": round(split["threads_cpu_s"] / window_s, 3)}


T = TypeVar("T")


def closed_window(run: ClosedLoopRun) -> tuple[dict[str, float], float]:
    return run.cpu_s, run.window_s


def open_window(run: OpenLoopRun) -> tuple[dict[str, float], float]:
    return run.cpu_s, run.wall_s


def _quiet(phases: Phases, measure: Callable[[], T],
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
        result = measure()
        cpu_s, wall_s = window(result)
        other = cpu_s.get("other", 0.0) / wall_s if wall_s > 0 else 0.0
        if other <= phases.noise_cores or tries > phases.noise_retries:
            return result, tries


def drive(producers: Producers, plan: ModelPlan, phases: Phases, meter: CpuMeter,
          model_cpu_per_wall: float, seed: int, profiler: ProfilerFactory | None,
          worker_pid: int, fresh: FreshRig | None = None) -> dict[str, Any]:
    """The closed loop, then each open-loop phase (on a rig of its own from ``fresh``,
    when given: see the module doc)."""
    rng = np.random.default_rng(seed)
    producers.warm_up(plan.max_batch_size * 2)
    closed, tries = _quiet(phases, lambda: producers.closed_loop(
        chunk=plan.chunk, lanes=plan.chunks_in_flight, warmup_s=phases.warmup_s,
        duration_s=phases.closed_s, meter=meter, max_requests=phases.max_requests),
        closed_window)
    saturation = closed.throughput_rps
    out: dict[str, Any] = {
        "throughput": {**summarize_closed(closed, model_cpu_per_wall), "tries": tries},
        "latency": []}

    def offer(load: float, coalesce: bool) -> Callable[[], OpenLoopRun]:
        def run(on: Producers, by: CpuMeter) -> OpenLoopRun:
            return on.open_loop(rate=max(1.0, saturation * load), duration_s=phases.open_s,
                                meter=by, rng=rng, max_requests=phases.max_requests,
                                coalesce=coalesce)

        if fresh is None:
            return lambda: run(producers, meter)
        make = fresh

        def fresh_run() -> OpenLoopRun:
            with make() as (on, by):
                return run(on, by)

        return fresh_run

    for load in phases.loads:
        run, tries = _quiet(phases, offer(load, False), open_window)
        out["latency"].append({**summarize_open(run, load, model_cpu_per_wall),
                               "tries": tries})
    if phases.coalesced_load is not None:
        run, tries = _quiet(phases, offer(phases.coalesced_load, True), open_window)
        out["latency_coalesced"] = {
            **summarize_open(run, phases.coalesced_load, model_cpu_per_wall, "coalesced"),
            "tries": tries}
    for load in phases.coalesced_loads:
        run, tries = _quiet(phases, offer(load, True), open_window)
        out.setdefault("latency_coalesced_loads", []).append(
            {**summarize_open(run, load, model_cpu_per_wall, "coalesced"), "tries": tries})
    if profiler is not None:
        with profiler(worker_pid, producers.pids[0]):
            profiled_closed = producers.closed_loop(
                chunk=plan.chunk, lanes=plan.chunks_in_flight, warmup_s=0.0,
                duration_s=phases.closed_s, meter=meter)
            opened = producers.open_loop(rate=max(1.0, saturation * 0.5),
                                         duration_s=phases.open_s, meter=meter, rng=rng)
        # py-spy slows what it samples, so nothing here is a result.
        out["profile_run"] = {"closed_throughput_rps": round(profiled_closed.throughput_rps, 1),
                              "open_achieved_rps": round(opened.achieved_rps, 1)}
    return out


def run_scenario(svc: fleet.Services, transport: str, plan: ModelPlan, phases: Phases, *,
                 model_cpu_per_wall: float, seed: int,
                 profiler: ProfilerFactory | None = None,
                 worker_args: tuple[str, ...] = (), workers: int = 1) -> dict[str, Any]:
    """Start ``workers`` worker processes for ``plan`` on ``transport`` and measure them.

    The producer processes are spawned first, so their imports overlap the workers'
    start-up; ``worker_args`` are extra ``batchfleet worker`` options (the SLO row).
    With several workers, the closed loop keeps ``workers`` windows outstanding, the
    ``worker`` CPU figures are their sum and the profile samples the first.
    """
    # Each worker gets the one worker's closed-loop window: a shared one would cap
    # N workers at the outstanding requests that keep one busy (Little's law).
    plan = replace(plan, chunks_in_flight=plan.chunks_in_flight * workers)
    started = time.time()

    @contextmanager
    def rig() -> Iterator[tuple[Producers, CpuMeter, list[int]]]:
        namespace = fleet.new_namespace(f"{plan.model}-{transport}")
        inputs = demo_inputs(plan.model, _INPUT_POOL, seed)
        with Producers(phases.producers, svc.broker_for(transport), svc.redis_url,
                       namespace, plan.model, inputs) as producers, \
                fleet.workers(svc, transport, plan.model, plan.max_batch_size,
                              plan.max_wait_ms, namespace, worker_args, workers) as procs:
            pids = [proc.proc.pid for proc in procs if proc.proc is not None]
            producers.ready()
            yield producers, CpuMeter({"worker": pids, "client": producers.pids,
                                       "bench": os.getpid(), **svc.server_pids()}), pids

    @contextmanager
    def fresh_log() -> Iterator[tuple[Producers, CpuMeter]]:
        with rig() as (producers, meter, _):
            producers.warm_up(plan.max_batch_size * 2)
            yield producers, meter

    fresh = fresh_log if transport == "kafka" else None
    with rig() as (producers, meter, pids):
        body = drive(producers, plan, phases, meter, model_cpu_per_wall, seed, profiler,
                     pids[0], fresh)
    return {"model": plan.model, "transport": transport,
            "max_batch_size": plan.max_batch_size, "max_wait_ms": plan.max_wait_ms,
            "closed_loop_window": plan.chunk * plan.chunks_in_flight,
            "producers": phases.producers, "workers": len(pids),
            "worker_args": list(worker_args), "fresh_log_per_phase": fresh is not None,
            "elapsed_s": round(time.time() - started, 1), **body}
