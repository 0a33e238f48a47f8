"""Models loaded on demand, measured (``bench --on-demand``; docs/models.md, "Loading on
demand"; numbers in docs/performance.md).

More models than fit: ``models`` copies of demo-encoder (different seeds) behind one
worker that may hold two (``--max-loaded-models 2``). Traffic moves between them: an
open-loop Poisson load of ``rps`` spread over a *hot pair* of models that shifts by one
model every ``phase_s`` seconds, so every phase brings one model that was evicted (or
never loaded) into use. Reported, for that worker and beside the same traffic on a
worker that holds every model:

* the *cold first request*: the caller latency (scheduled arrival to result) of the
  first request each phase sends to the model it brings in, p50 and p99;
* loads and evictions per minute (the worker's own counters, from its heartbeat);
* throughput (answered per second over the run) and caller p50/p99 of all requests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from typing import Any

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.open_loop import poisson_arrivals
from batchfleet.bench.samples import Sample, latency_summary, sample_of
from batchfleet.connectors import open_control_plane
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.producers.client import new_request_id
from batchfleet.schemas.errors import WaitTimeoutError

#: How long after the last arrival a request may still be answered.
DRAIN_S = 60.0
SEQ = 64
VOCAB = 1000


def model_names(count: int) -> list[str]:
    return [f"enc{i}" for i in range(count)]


def schedule(offsets: np.ndarray[Any, Any], count: int, phase_s: float,
             rng: np.random.Generator) -> tuple[list[str], list[bool]]:
    """Each arrival's model (one of the phase's hot pair, at random) and whether it is
    the first request of its phase to the model the phase brings in (phase k's pair is
    models k and k+1, modulo ``count``: phase k brings in model k+1)."""
    names = model_names(count)
    models: list[str] = []
    first: list[bool] = []
    opened: set[int] = set()
    for offset in offsets:
        phase = int(offset // phase_s)
        pick = phase + int(rng.integers(0, 2))
        models.append(names[pick % count])
        newcomer = pick == phase + 1 and phase not in opened
        if newcomer:
            opened.add(phase)
        first.append(newcomer)
    return models, first


async def _phase(broker: str, namespace: str, count: int, rps: float, seconds: float,
                 phase_s: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    offsets = poisson_arrivals(rps, seconds, rng)
    models, first = schedule(offsets, count, phase_s, rng)
    rows = rng.integers(0, VOCAB, (len(offsets), SEQ), dtype=np.int64)
    ids = [new_request_id() for _ in offsets]
    firsts = {rid for rid, is_first in zip(ids, first, strict=True) if is_first}
    sent: dict[str, float] = {}
    samples: dict[str, Sample] = {}
    async with AsyncClient(broker, namespace=namespace, poll_interval_s=30.0,
                           check_model=False) as client:

        async def collect() -> None:
            try:
                async for res in client.as_completed(ids, seconds + DRAIN_S):
                    samples[res.request_id] = sample_of(res, sent[res.request_id],
                                                        time.time())
            except WaitTimeoutError:
                pass  # the rest never got a terminal result in time: unanswered

        collector = asyncio.create_task(collect())
        await asyncio.sleep(0.2)
        t0 = time.time()
        tasks = []
        for rid, offset, model, row in zip(ids, offsets, models, rows, strict=True):
            await asyncio.sleep(max(0.0, t0 + float(offset) - time.time()))
            sent[rid] = t0 + float(offset)
            tasks.append(asyncio.create_task(
                client.submit(model, row, request_id=rid, fingerprint="")))
        await asyncio.gather(*tasks)
        await collector
        elapsed = max(s.done for s in samples.values()) - t0 if samples else seconds
        await asyncio.sleep(2.5)  # one more heartbeat, with the final counts
        plane = open_control_plane(broker, namespace=namespace)
        try:
            beats = await plane.heartbeats.read_all()
        finally:
            await plane.close()
    extra = beats[0].extra if beats else {}
    statuses = Counter(s.status for s in samples.values())
    minutes = elapsed / 60.0
    return {
        "arrivals": len(ids), "statuses": dict(statuses),
        "unanswered": len(ids) - len(samples),
        "throughput_rps": round(statuses.get("succeeded", 0) / elapsed, 1),
        "latency": latency_summary(list(samples.values())),
        "cold_first": latency_summary([samples[r] for r in firsts if r in samples]),
        "cold_firsts": len(firsts),
        "loads": extra.get("model_loads"), "evictions": extra.get("model_evictions"),
        "loads_per_min": (None if "model_loads" not in extra
                          else round(extra["model_loads"] / minutes, 1)),
        "evictions_per_min": (None if "model_evictions" not in extra
                              else round(extra["model_evictions"] / minutes, 1)),
    }


def _measure(svc: fleet.Services, count: int, rps: float, seconds: float, phase_s: float,
             seed: int, extra: tuple[str, ...]) -> dict[str, Any]:
    namespace = fleet.new_namespace("ondemand")
    specs = tuple(f"{name}=demo-encoder:seed={i + 1}"
                  for i, name in enumerate(model_names(count)))
    proc = WorkerProcess(svc.redis_url, svc.redis_url, models=specs, namespace=namespace,
                         log_level="warning", env=dict(svc.worker_env), keep_log=False,
                         extra_args=("--no-webhooks", "--max-batch-size", "32", *extra))
    with proc:
        proc.wait_ready()
        return asyncio.run(_phase(svc.redis_url, namespace, count, rps, seconds, phase_s,
                                  seed))


def run_on_demand(redis_url: str | None, models: int = 6, rps: float = 40.0,
                  seconds: float = 40.0, phase_s: float = 2.0, seed: int = 11,
                  min_residency_s: float = 1.0) -> dict[str, Any]:
    """The same traffic on a worker holding two models and on one holding them all."""
    started = time.time()
    with fleet.services(redis_url, None, False) as svc:
        two = _measure(svc, models, rps, seconds, phase_s, seed,
                       ("--max-loaded-models", "2", "--min-residency-s", str(min_residency_s)))
        every = _measure(svc, models, rps, seconds, phase_s, seed, ())
    return {"models": models, "rps": rps, "seconds": seconds, "phase_s": phase_s,
            "min_residency_s": min_residency_s, "elapsed_s": round(time.time() - started, 1),
            "on_demand": two, "all_loaded": every}


def _ms(value: float) -> str:
    return f"{value:,.1f}" if math.isfinite(value) else "—"


def render(found: dict[str, Any]) -> str:
    """The markdown table ``bench --on-demand`` prints (docs/performance.md)."""
    lines = [f"{found['models']} demo-encoder models, open-loop {found['rps']:g} req/s for "
             f"{found['seconds']:g} s on a hot pair that moves by one model every "
             f"{found['phase_s']:g} s; a fresh worker each "
             f"(`--min-residency-s {found['min_residency_s']:g}`).\n",
             "| worker | cold first p50 ms | cold first p99 ms | firsts | loads/min | "
             "evictions/min | throughput req/s | all p50 ms | all p99 ms | unanswered |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, key in (("`--max-loaded-models 2`", "on_demand"),
                       ("every model loaded", "all_loaded")):
        p = found[key]
        cold, lat = p["cold_first"], p["latency"]
        lines.append(
            f"| {label} | {_ms(cold['p50_ms'])} | {_ms(cold['p99_ms'])} | {p['cold_firsts']} "
            f"| {p['loads_per_min'] if p['loads_per_min'] is not None else '—'} "
            f"| {p['evictions_per_min'] if p['evictions_per_min'] is not None else '—'} "
            f"| {p['throughput_rps']} | {_ms(lat['p50_ms'])} | {_ms(lat['p99_ms'])} "
            f"| {p['unanswered']} |")
    return "\n".join(lines)
