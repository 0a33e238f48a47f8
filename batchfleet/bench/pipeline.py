"""Bench: a two-step pipeline against the same work in one handler, in one run.

``demo-tokenize -> demo-encoder`` as a pipeline (each step its own worker process, its
own lane, a queue hop between; then both steps on one process, which is the split's cost
alone) against ``tokenize-encode``, one handler that does both in one forward, on one
worker process. Same Redis, same inputs, same request count;
reports throughput and the caller's p50/p99 (submit to result, the result's own
timestamps) for each. Run: ``python -m batchfleet.bench.pipeline [N]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import numpy as np
from torch import nn

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.pipeline import from_steps
from batchfleet.schemas.registry import Declaration
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.workers.models.builtin import TOKENIZE_BYTES, DemoTokenize, build_encoder
from batchfleet.workers.models.handler import TorchModuleHandler

WORKER_ARGS = ("--max-batch-size", "32", "--max-wait-ms", "5")


def tokenize_encode() -> TorchModuleHandler:
    """The same work in one handler: tokenize and encode in one forward."""
    return TorchModuleHandler("tokenize-encode", nn.Sequential(DemoTokenize(), build_encoder()),
                              input_spec=TensorSpec("uint8", (TOKENIZE_BYTES,)))


async def _measure(url: str, ns: str, target: str, rows: np.ndarray) -> dict[str, Any]:
    async with AsyncClient(url, namespace=ns) as client:
        warm = await client.submit_many(target, list(rows[:64]))
        await client.wait_many(warm, timeout=300)
        start = time.perf_counter()
        ids = await client.submit_many(target, list(rows))
        results = await client.wait_many(ids, timeout=600)
        wall = time.perf_counter() - start
    assert all(r.status == "succeeded" for r in results), "a bench request did not succeed"
    latency_ms = np.array([((r.finished_at or 0.0) - r.enqueued_at) * 1000.0 for r in results])
    return {"target": target, "requests": len(rows), "wall_s": round(wall, 2),
            "throughput_rps": round(len(rows) / wall, 1),
            "p50_ms": round(float(np.percentile(latency_ms, 50)), 1),
            "p99_ms": round(float(np.percentile(latency_ms, 99)), 1)}


async def run(n: int) -> list[dict[str, Any]]:
    rows = np.random.default_rng(0).integers(32, 127, (n, TOKENIZE_BYTES), dtype=np.uint8)
    out: list[dict[str, Any]] = []
    with EmbeddedRedis() as server:
        url = server.url
        # the pipeline: one worker per step
        from batchfleet.connectors import open_control_plane

        plane = open_control_plane(url, namespace="pipe")
        try:
            for model in ("demo-tokenize", "demo-encoder"):
                await plane.models.declare(model, Declaration(time.time()))
            await plane.pipelines.declare(from_steps("embed", "demo-tokenize,demo-encoder"))
        finally:
            await plane.close()
        steps = [WorkerProcess(url, models=(m,), namespace="pipe", extra_args=WORKER_ARGS)
                 for m in ("demo-tokenize", "demo-encoder")]
        try:
            for w in steps:
                w.start()
            for w in steps:
                await asyncio.to_thread(w.wait_ready)
            out.append({"setup": "pipeline, 2 worker processes",
                        **await _measure(url, "pipe", "embed", rows)})
        finally:
            for w in steps:
                w.terminate()
        both = WorkerProcess(url, models=("demo-tokenize", "demo-encoder"), namespace="pipe",
                             extra_args=WORKER_ARGS)
        try:  # the split's cost alone: both steps on one process, as the one handler is
            both.start()
            await asyncio.to_thread(both.wait_ready)
            out.append({"setup": "pipeline, 1 worker process",
                        **await _measure(url, "pipe", "embed", rows)})
        finally:
            both.terminate()
        one = WorkerProcess(url, models=("tokenize-encode=batchfleet.bench.pipeline:"
                                         "tokenize_encode",),
                            namespace="one", extra_args=WORKER_ARGS)
        try:
            one.start()
            await asyncio.to_thread(one.wait_ready)
            out.append({"setup": "one handler, 1 worker process",
                        **await _measure(url, "one", "tokenize-encode", rows)})
        finally:
            one.terminate()
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rows = asyncio.run(run(n))
    print(json.dumps(rows, indent=1))
    for r in rows:
        print(f"{r['setup']:32} {r['throughput_rps']:>8} req/s  p50 {r['p50_ms']:>8} ms  "
              f"p99 {r['p99_ms']:>8} ms")


if __name__ == "__main__":
    main()
