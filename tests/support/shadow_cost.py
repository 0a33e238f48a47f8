"""What a shadow costs stable traffic: ``python -m tests.support.shadow_cost [--n N]``.

Starts, per scenario, a redis-server and one worker process serving demo-mlp and
demo-encoder (plus a shadow version of each), then runs a closed loop of sequential
requests (one demo-mlp, then one demo-encoder, each waited for) and prints stable p50/p99
per model, submit to result, with the worker's shadow counters scraped from /metrics.
Scenarios: no shadow; demo-mlp shadowed by a version that waits 0.5 s per batch; and
demo-encoder shadowed by itself (CPU-bound), under the default budget and with none.
The numbers in docs/performance.md ("Shadow cost") come from this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
import urllib.request
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from tests.support.seams import model_registry_for, open_result_store

MODELS = ("demo-mlp", "demo-mlp@slow=tests.support.models:slow_shadow",
          "demo-encoder", "demo-encoder@twin=demo-encoder")
#: name -> (model to shadow, shadow label, extra worker args)
SCENARIOS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "none": (None, None, ()),
    "slow": ("demo-mlp", "slow", ()),
    "cpu": ("demo-encoder", "twin", ()),
    "cpu-nolimit": ("demo-encoder", "twin", ("--shadow-budget", "none")),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value, for the shadow and version counters."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            wanted = s.name.startswith("batchfleet_version_compute_seconds_sum") or (
                "shadow" in s.name and "abs_diff" not in s.name and "_created" not in s.name)
            if wanted:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


async def closed_loop(url: str, n: int) -> tuple[dict[str, list[float]], float]:
    rng = np.random.default_rng(1)
    lat: dict[str, list[float]] = {"demo-mlp": [], "demo-encoder": []}
    async with AsyncClient(url) as client:
        start = time.monotonic()
        for _ in range(n):
            for model, x in (("demo-mlp", rng.standard_normal(10).astype(np.float32)),
                             ("demo-encoder", rng.integers(1, 100, 64).astype(np.int64))):
                t0 = time.perf_counter()
                rid = await client.submit(model, x)
                result = await client.wait(rid, timeout=60)
                assert result.status == "succeeded", result
                lat[model].append((time.perf_counter() - t0) * 1000.0)
        return lat, time.monotonic() - start


async def scenario(url: str, name: str, n: int) -> dict[str, Any]:
    model, shadow, args = SCENARIOS[name]
    port = free_port()
    worker = WorkerProcess(url, models=MODELS,
                           extra_args=("--metrics-port", str(port), "--max-wait-ms", "2",
                                       *args))
    with worker:
        await asyncio.to_thread(worker.wait_ready)
        store = open_result_store(url, Names())
        try:
            if model is not None:
                await model_registry_for(store).set_policy(
                    model, stable="default", shadow=shadow, who="bench", why=name)
                await asyncio.sleep(2.5)  # the worker's routing polls every second
        finally:
            await store.close()
        await closed_loop(url, 20)  # warm the client path
        before = scrape(port)
        lat, wall_s = await closed_loop(url, n)
        after = scrape(port)
    counters = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    shadow_s = sum(v for k, v in counters.items()
                   if k.startswith("batchfleet_version_compute_seconds_sum") and "role=shadow" in k)
    return {"scenario": name, "n": n, "wall_s": round(wall_s, 2),
            "shadow_wall_share": round(shadow_s / wall_s, 3),
            **{f"{m} p50/p99 ms": (round(pct(v, 50), 1), round(pct(v, 99), 1))
               for m, v in lat.items()},
            "counters": {k: v for k, v in counters.items() if "version_compute" not in k}}


async def main(n: int, names: list[str]) -> None:
    for name in names:  # a fresh redis-server per scenario
        with EmbeddedRedis() as redis:
            print(json.dumps(await scenario(redis.url, name, n)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="closed-loop rounds per scenario")
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    ns = parser.parse_args()
    asyncio.run(main(ns.n, ns.scenarios))
