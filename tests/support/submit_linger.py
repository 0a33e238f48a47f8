"""The client's CPU per request with one ``submit()`` per arrival, by submit linger:
``python -m tests.support.submit_linger [--rate 2000] [--seconds 8] [--linger-ms 0.5 2 ...]``.

Per linger, one run: an embedded Redis and one real demo-mlp worker process (the bench's
own), then this process offers Poisson arrivals at ``--rate``/s with the bench's open
loop (``batchfleet.bench.open_loop.offer``, each arrival its own ``submit()`` in its own
task) and prints the client's CPU per request (``time.process_time``), the caller's p50
and p99 from the scheduled arrival, and the client's lag behind the schedule. The
``SUBMIT_LINGER_S`` row of docs/performance.md comes from this script; run it under
``py-spy record`` for the profile.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from batchfleet.bench import fleet
from batchfleet.bench.open_loop import offer, poisson_arrivals
from batchfleet.producers import AsyncClient


async def _offer(redis_url: str, namespace: str, rate: float, seconds: float,
                 linger_s: float) -> str:
    async with AsyncClient(redis_url, redis_url, namespace=namespace,
                           poll_interval_s=30.0) as client:
        client._outbox._linger_s = linger_s  # the one knob measured here
        inputs = np.random.default_rng(0).standard_normal((512, 10)).astype(np.float32)
        await client.wait_many(await client.submit_many("demo-mlp", inputs[:256]), 60)
        offsets = poisson_arrivals(rate, seconds, np.random.default_rng(1))

        async def start_at() -> float:
            return time.time() + 0.3

        cpu0 = time.process_time()
        got = await offer(client, "demo-mlp", inputs, offsets, start_at=start_at)
        cpu_us = (time.process_time() - cpu0) / max(1, len(got.rows)) * 1e6
    latency = np.array([row[1] - row[0] for row in got.rows]) * 1000.0
    p50, p99 = np.percentile(latency, [50, 99])
    lag99 = float(np.percentile(got.start_lag_ms, 99))
    return (f"linger {linger_s * 1000:.1f} ms: {len(got.rows)}/{got.arrivals} answered, "
            f"client CPU {cpu_us:.1f} us/request, caller p50 {p50:.2f} / p99 {p99:.2f} ms, "
            f"client lag p99 {lag99:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--linger-ms", type=float, nargs="+", default=[0.5, 2.0, 0.5, 2.0])
    args = parser.parse_args()
    for linger_ms in args.linger_ms:
        with fleet.services(None, None, False) as svc:
            namespace = fleet.new_namespace("linger")
            with fleet.worker(svc, "redis", "demo-mlp", 256, 5.0, namespace):
                print(asyncio.run(_offer(svc.redis_url, namespace, args.rate, args.seconds,
                                         linger_ms / 1000.0)), flush=True)


if __name__ == "__main__":
    main()
