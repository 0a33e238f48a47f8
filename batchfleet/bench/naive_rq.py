"""Baseline (b): naive RQ, one job per request, the same model on the same Redis.

Workers are started first and warmed with a few jobs (so the model is loaded
and nobody is charged for interpreter start-up), then N jobs are enqueued in
pipelined chunks and the clock runs from the first enqueue until the finished
registry holds all N: enqueue to all finished, end to end. Each worker class
is measured on its own queue, so the fastest can be named rather than assumed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
from rq import Queue

from batchfleet.bench.procstat import CpuMeter
from batchfleet.bench.rq_jobs import predict_one
from batchfleet.schemas.errors import ConfigError

_ENQUEUE_CHUNK = 500
_WARM_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class RqRun:
    worker_class: str
    workers: int
    jobs: int
    seconds: float
    enqueue_s: float
    worker_cpu_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"worker_class": self.worker_class, "workers": self.workers, "jobs": self.jobs,
                "seconds": round(self.seconds, 3), "enqueue_s": round(self.enqueue_s, 3),
                "jobs_per_s": round(self.jobs / self.seconds, 1),
                "worker_cpu_us_per_job": round(self.worker_cpu_s / self.jobs * 1e6, 1)}


def _start_workers(redis_url: str, queue: str, worker_class: str, n: int,
                   env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--worker-class",
            worker_class, "--quiet", "--disable-job-desc-logging", queue]
    return [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, **env})
            for _ in range(n)]


def _wait_finished(q: Queue, count: int, procs: list[subprocess.Popen[bytes]],
                   timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    finished, failed = q.finished_job_registry, q.failed_job_registry
    while finished.count < count:
        if failed.count:
            raise ConfigError(f"naive RQ jobs failed on {q.name}: see `rq info`")
        for proc in procs:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise ConfigError(f"rq worker exited with {proc.returncode}: {err[-2000:]}")
        if time.monotonic() > deadline:
            raise ConfigError(f"naive RQ: {finished.count}/{count} jobs after {timeout_s}s")
        time.sleep(0.005)


def run_rq(redis_url: str, worker_class: str, jobs: int, workers: int = 1,
           timeout_s: float = 600.0, seed: int = 7, env: dict[str, str] | None = None
           ) -> RqRun:
    """Time ``jobs`` demo-mlp requests through ``workers`` RQ workers of ``worker_class``."""
    conn = redis.Redis.from_url(redis_url)
    q = Queue(f"bench-rq-{uuid.uuid4().hex[:8]}", connection=conn)
    rows = np.random.default_rng(seed).random((jobs, 10), dtype=np.float32)
    procs = _start_workers(redis_url, q.name, worker_class, workers, env or {})
    try:
        warm = 2 * workers
        for _ in range(warm):
            q.enqueue(predict_one, [0.5] * 10)
        _wait_finished(q, warm, procs, _WARM_TIMEOUT_S)
        meter = CpuMeter({f"rq{i}": p.pid for i, p in enumerate(procs)})
        before = meter.snapshot(time.time())
        start = time.perf_counter()
        for lo in range(0, jobs, _ENQUEUE_CHUNK):
            q.enqueue_many([Queue.prepare_data(predict_one, ([float(v) for v in row],))
                            for row in rows[lo:lo + _ENQUEUE_CHUNK]])
        enqueued = time.perf_counter() - start
        _wait_finished(q, warm + jobs, procs, timeout_s)
        took = time.perf_counter() - start
        # Fork and spawn workers burn CPU in children that are gone by now; the
        # parents' own time is what /proc still shows, so this is a lower bound there.
        used = CpuMeter.usage(before, meter.snapshot(time.time()))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        conn.close()
    cpu = sum(v for k, v in used.items() if k.startswith("rq"))
    return RqRun(worker_class, workers, jobs, took, enqueued, cpu)


def _jobs_for(worker_class: str, jobs: int, slow_jobs: int) -> int:
    """SimpleWorker gets the full count; fork and spawn workers pay a process per job
    (a stock fork or spawn worker also re-imports torch per job, ~1-3 s), so fewer."""
    if worker_class.endswith("SimpleWorker"):
        return jobs
    if worker_class.endswith("PreloadedForkWorker"):
        return slow_jobs
    return max(3, slow_jobs // 6)


def naive_rq(redis_url: str, classes: tuple[str, ...], jobs: int, slow_jobs: int,
             pool: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every class with one worker (the fleet runs one), the fastest named, plus a pool.

    ``env`` is the fleet workers' extra environment (torch threads), so both sides
    run the model the same way.
    """
    runs = [run_rq(redis_url, cls, _jobs_for(cls, jobs, slow_jobs), env=env) for cls in classes]
    fastest = max(runs, key=lambda r: r.jobs / r.seconds)
    out: dict[str, Any] = {"model": "demo-mlp", "runs": [r.as_dict() for r in runs],
                           "fastest": fastest.as_dict()}
    if pool > 1:
        out["pool"] = run_rq(redis_url, fastest.worker_class, jobs, workers=pool,
                             env=env).as_dict()
    return out
