"""Graceful degradation, measured (``bench --degrade``; docs/degradation.md).

A model that fails every request (its backend is down) while traffic continues: an
open-loop Poisson load of ``rps`` for ``seconds``, twice, each against a fresh worker
process. First without a fallback (today's behaviour: retries, the DLQ, the breaker
pausing the lane), then with ``--fallback 'broken=rules:...'``. For each, the caller's
latency (scheduled arrival to result at the client) over the answered requests, and
the share of requests that got a usable (``succeeded``) answer; a request with no
terminal result by the end of the drain counts as unanswered.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.open_loop import poisson_arrivals
from batchfleet.bench.samples import Sample, latency_summary, sample_of
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.producers.client import new_request_id
from batchfleet.schemas.errors import WaitTimeoutError

MODEL = "broken"
SPEC = f"{MODEL}=batchfleet.bench.degrade:broken_model"
CHAIN = f"{MODEL}=rules:batchfleet.bench.degrade:rules_score"
#: How long after the last arrival a request may still be answered.
DRAIN_S = 30.0


def broken_model() -> Any:
    """A model whose every forward raises. No input spec, so there is no warm-up forward
    (which would stop the worker at start-up)."""
    from torch import nn

    from batchfleet.workers.models import TorchModuleHandler

    class Broken(nn.Module):
        def forward(self, x: Any) -> Any:
            raise RuntimeError("the model's backend is down")

    return TorchModuleHandler(MODEL, Broken())


def rules_score(inputs: Sequence[Any]) -> np.ndarray[Any, Any]:
    """The fallback: the mean of each row's features, as float32[1]."""
    rows = np.stack([np.asarray(x, np.float32) for x in inputs])
    out: np.ndarray[Any, Any] = rows.mean(axis=1, keepdims=True)
    return out


async def _phase(broker: str, namespace: str, rps: float, seconds: float, drain_s: float,
                 seed: int) -> dict[str, Any]:
    """Poisson arrivals, one ``submit`` each in its own task; latency from the scheduled
    arrival to the result at the client; what has no result ``drain_s`` after the last
    arrival is unanswered."""
    rng = np.random.default_rng(seed)
    inputs = rng.random((4096, 10), dtype=np.float32)
    offsets = poisson_arrivals(rps, seconds, rng)
    ids = [new_request_id() for _ in offsets]
    sent: dict[str, float] = {}
    samples: list[Sample] = []
    async with AsyncClient(broker, namespace=namespace, poll_interval_s=30.0,
                           check_model=False) as client:

        async def collect() -> None:
            try:
                async for res in client.as_completed(ids, seconds + drain_s):
                    samples.append(sample_of(res, sent[res.request_id], time.time()))
            except WaitTimeoutError:
                pass  # the rest never got a terminal result in time: unanswered

        collector = asyncio.create_task(collect())
        await asyncio.sleep(0.2)
        t0 = time.time()
        tasks = []
        for rid, offset, row in zip(ids, offsets, inputs, strict=False):
            await asyncio.sleep(max(0.0, t0 + float(offset) - time.time()))
            sent[rid] = t0 + float(offset)
            tasks.append(asyncio.create_task(
                client.submit(MODEL, row, request_id=rid, fingerprint="")))
        await asyncio.gather(*tasks)
        await collector
    statuses = Counter(s.status for s in samples)
    arrivals = max(1, len(ids))
    return {"arrivals": len(ids), "answered": statuses.get("succeeded", 0),
            "share_answered": round(statuses.get("succeeded", 0) / arrivals, 4),
            "unanswered": len(ids) - len(samples), "statuses": dict(statuses),
            "latency": latency_summary(samples)}


def _measure(svc: fleet.Services, rps: float, seconds: float, drain_s: float, seed: int,
             extra: tuple[str, ...]) -> dict[str, Any]:
    namespace = fleet.new_namespace("degrade")
    proc = WorkerProcess(svc.redis_url, svc.redis_url, models=(SPEC,), namespace=namespace,
                         log_level="warning", env=dict(svc.worker_env), keep_log=False,
                         extra_args=extra)
    with proc:
        proc.wait_ready()
        return asyncio.run(_phase(svc.redis_url, namespace, rps, seconds, drain_s, seed))


def run_degrade(redis_url: str | None, rps: float = 50.0, seconds: float = 10.0,
                seed: int = 7, drain_s: float = DRAIN_S) -> dict[str, Any]:
    """Both phases on one Redis (embedded unless given)."""
    started = time.time()
    with fleet.services(redis_url, None, False) as svc:
        without = _measure(svc, rps, seconds, drain_s, seed, ("--no-webhooks",))
        with_chain = _measure(svc, rps, seconds, drain_s, seed,
                              ("--no-webhooks", "--fallback", CHAIN))
    return {"model": MODEL, "rps": rps, "seconds": seconds, "drain_s": drain_s,
            "elapsed_s": round(time.time() - started, 1),
            "without_fallback": without, "with_fallback": with_chain}


def _ms(value: float) -> str:
    """A latency, or ``—`` when no request was answered to time."""
    return f"{value:,.1f}" if math.isfinite(value) else "—"


def render(found: dict[str, Any]) -> str:
    """The markdown table ``bench --degrade`` prints (docs/performance.md)."""
    lines = [f"A model failing every request; open-loop {found['rps']:g} req/s for "
             f"{found['seconds']:g} s per phase, a fresh worker each (default retries: 3 "
             "attempts; breaker: 5 failures, 5 s cool-down).\n",
             "| | share answered | caller p50 ms | caller p99 ms | max ms | arrivals | "
             f"no result {found['drain_s']:g} s after the last arrival | statuses |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for label, key in (("without fallback", "without_fallback"),
                       ("with `--fallback rules:…`", "with_fallback")):
        p = found[key]
        lat = p["latency"]
        ms = [_ms(lat[k]) for k in ("p50_ms", "p99_ms", "max_ms")]
        lines.append(f"| {label} | {p['share_answered']:.1%} | {' | '.join(ms)} | "
                     f"{p['arrivals']} | {p['unanswered']} | {p['statuses']} |")
    return "\n".join(lines)
