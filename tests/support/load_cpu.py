"""What a request costs each process at a fixed offered rate, below saturation:
``python -m tests.support.load_cpu [--rates 1000 2000 4000 8000] [--seconds 6]
[--per-arrival]``, and what a batch costs the worker's event loop when saturated:
``python -m tests.support.load_cpu --closed 16 64 256``.

An embedded Redis and one real demo-mlp worker process (``max_batch_size`` 256,
``max_wait_ms`` 5, the bench's), then this process offers Poisson arrivals at each rate
with the bench's open loop (``submit_many`` per tick, or one ``submit()`` per arrival
with ``--per-arrival``) and prints, per rate: the CPU per request of the worker's event
loop, of its other threads, of Redis and of this client (each thread's nanosecond
``schedstat``), the worker's fetches (``XREADGROUP``) and batches (its ack's ``XACK``)
per request from ``INFO commandstats``, the mean batch, and fleet- and caller-side
p50/p99. With ``--closed``, a fresh worker per ``max_batch_size`` is kept saturated by
four lanes of 256-request ``submit_many`` and the loop's CPU per batch and per request
is printed: the fixed part per batch is the difference between sizes.
docs/performance.md, "CPU per request rises as load falls", comes from it.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from batchfleet.bench import fleet
from batchfleet.bench.open_loop import offer, poisson_arrivals
from batchfleet.producers import AsyncClient


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """Seconds on a CPU per thread of ``pid`` (``/proc/PID/task/TID/schedstat``)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return out


async def _calls(raw: aioredis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in (await raw.info("commandstats")).items()}


async def _phase(client: AsyncClient, raw: aioredis.Redis, worker_pid: int, redis_pid: int,
                 rate: float, seconds: float, coalesce: bool) -> str:
    inputs = np.random.default_rng(0).standard_normal((512, 10)).astype(np.float32)
    offsets = poisson_arrivals(rate, seconds, np.random.default_rng(1))

    async def start_at() -> float:
        return time.time() + 0.3

    calls0, worker0, redis0 = await _calls(raw), _thread_cpu_s(worker_pid), \
        sum(_thread_cpu_s(redis_pid).values())
    client0 = time.thread_time()
    got = await offer(client, "demo-mlp", inputs, offsets, start_at=start_at,
                      coalesce=coalesce)
    client_s = time.thread_time() - client0
    worker1, redis_s = _thread_cpu_s(worker_pid), sum(_thread_cpu_s(redis_pid).values()) - redis0
    calls1 = await _calls(raw)
    n = max(1, len(got.rows))
    loop_s = worker1.get(worker_pid, 0.0) - worker0.get(worker_pid, 0.0)
    other_s = sum(t - worker0.get(tid, 0.0) for tid, t in worker1.items() if tid != worker_pid)

    def per_request(command: str) -> float:
        key = f"cmdstat_{command}"
        return (calls1.get(key, 0) - calls0.get(key, 0)) / n

    caller = np.array([row[1] - row[0] for row in got.rows]) * 1000.0
    fleet_ms = np.array([row[7] - row[6] for row in got.rows]) * 1000.0
    batch = float(np.mean([row[5] for row in got.rows]))
    us = 1e6 / n
    return (f"{rate:6.0f}/s: worker loop {loop_s * us:6.1f}, other threads {other_s * us:5.1f}, "
            f"redis {redis_s * us:5.1f}, client {client_s * us:6.1f} us/request; "
            f"fetches {per_request('xreadgroup'):.3f}, batches {per_request('xack'):.4f} "
            f"per request, mean batch {batch:.1f}; fleet p50/p99 "
            f"{np.percentile(fleet_ms, 50):.1f}/{np.percentile(fleet_ms, 99):.1f} ms, caller "
            f"{np.percentile(caller, 50):.1f}/{np.percentile(caller, 99):.1f} ms")


async def _run(url: str, namespace: str, worker_pid: int, rates: list[float],
               seconds: float, coalesce: bool) -> None:
    raw = aioredis.Redis.from_url(url)
    try:
        redis_pid = int((await raw.info("server"))["process_id"])
        async with AsyncClient(url, url, namespace=namespace, poll_interval_s=30.0) as client:
            warm = np.random.default_rng(0).standard_normal((256, 10)).astype(np.float32)
            await client.wait_many(await client.submit_many("demo-mlp", warm), 60)
            for rate in rates:
                print(await _phase(client, raw, worker_pid, redis_pid, rate, seconds,
                                   coalesce), flush=True)
    finally:
        await raw.aclose()


async def _closed(url: str, namespace: str, worker_pid: int, seconds: float) -> str:
    """Four lanes of 256-request ``submit_many`` for ``seconds``: the loop's CPU."""
    inputs = np.random.default_rng(0).standard_normal((256, 10)).astype(np.float32)
    async with AsyncClient(url, url, namespace=namespace, poll_interval_s=30.0) as client:
        await client.wait_many(await client.submit_many("demo-mlp", inputs), 60)
        stop = time.monotonic() + seconds
        requests, batches = 0, set()

        async def lane() -> None:
            nonlocal requests
            while time.monotonic() < stop:
                for result in await client.wait_many(
                        await client.submit_many("demo-mlp", inputs), 60):
                    requests += 1
                    batches.add(result.finished_at)  # one batch's results share it
        before = _thread_cpu_s(worker_pid).get(worker_pid, 0.0)
        await asyncio.gather(*(lane() for _ in range(4)))
        loop_s = _thread_cpu_s(worker_pid).get(worker_pid, 0.0) - before
    n, b = max(1, requests), max(1, len(batches))
    return (f"{requests / seconds:7.0f} req/s, mean batch {n / b:5.1f}: worker loop "
            f"{loop_s / b * 1000:.2f} ms per batch, {loop_s / n * 1e6:.1f} us per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--per-arrival", action="store_true",
                        help="one submit() per arrival instead of submit_many per tick")
    parser.add_argument("--closed", type=int, nargs="+", metavar="MAX_BATCH_SIZE",
                        help="saturate a fresh worker per max_batch_size instead")
    args = parser.parse_args()
    if args.closed:
        with fleet.services(None, None, False) as svc:
            for size in args.closed:
                namespace = fleet.new_namespace("load-cpu")
                with fleet.worker(svc, "redis", "demo-mlp", size, 5.0, namespace) as worker:
                    assert worker.proc is not None
                    print(f"max_batch_size {size:4d}: " + asyncio.run(_closed(
                        svc.redis_url, namespace, worker.proc.pid, args.seconds)), flush=True)
        return
    with fleet.services(None, None, False) as svc:
        namespace = fleet.new_namespace("load-cpu")
        with fleet.worker(svc, "redis", "demo-mlp", 256, 5.0, namespace) as worker:
            assert worker.proc is not None
            asyncio.run(_run(svc.redis_url, namespace, worker.proc.pid, args.rates,
                             args.seconds, not args.per_arrival))


if __name__ == "__main__":
    main()
