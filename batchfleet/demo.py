"""``batchfleet demo``: the whole pipeline on this machine, measured.

It brings up what is missing (an embedded Redis; the bundled Kafka-compatible
broker for ``--broker kafka``), starts a real worker process, submits a burst
of requests through the SDK and waits for every terminal result.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import ConfigError, WaitTimeoutError
from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN, ENCODER_VOCAB


@dataclass(frozen=True, slots=True)
class DemoOptions:
    broker: str | None
    results: str | None
    requests: int
    model: str
    max_batch_size: int
    max_wait_ms: float
    timeout_s: float
    as_json: bool


@dataclass(slots=True)
class DemoReport:
    requests: int
    elapsed_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return self.requests - sum(self.statuses.values())

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "requests": self.requests,
            "succeeded": self.statuses["succeeded"],
            "failed": self.statuses["failed"],
            "expired": self.statuses["expired"],
            "missing": self.missing,
            "throughput_rps": round(self.requests / self.elapsed_s, 1) if self.elapsed_s else 0,
            "latency_p50_ms": round(percentile(lat, 50), 2),
            "latency_p95_ms": round(percentile(lat, 95), 2),
            "latency_p99_ms": round(percentile(lat, 99), 2),
            "mean_batch_size": round(float(np.mean(self.batch_sizes)), 2)
            if self.batch_sizes else 0.0,
            "mean_queue_ms": round(float(np.mean(self.queue_ms)), 2) if self.queue_ms else 0.0,
        }


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def demo_inputs(model: str, n: int, seed: int = 7) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if model == "demo-encoder":
        return rng.integers(0, ENCODER_VOCAB, size=(n, ENCODER_SEQ_LEN), dtype=np.int64)
    if model == "demo-mlp":
        return rng.random((n, 10), dtype=np.float32)
    raise ConfigError(f"the demo drives demo-mlp or demo-encoder, not {model!r}")


async def drive(broker: str, results: str | None, model: str, n: int, timeout_s: float
                ) -> DemoReport:
    report = DemoReport(n)
    inputs = demo_inputs(model, n)
    async with AsyncClient(broker, results) as client:
        start = time.time()
        ids = await client.submit_many(model, inputs)
        try:
            async for res in client.as_completed(ids, timeout_s):
                now = time.time()
                report.statuses[res.status] += 1
                report.latencies_ms.append((now - res.enqueued_at) * 1000.0)
                if res.batch_size:
                    report.batch_sizes.append(res.batch_size)
                if res.queue_ms is not None:
                    report.queue_ms.append(res.queue_ms)
                report.elapsed_s = now - start
        except WaitTimeoutError:
            pass
    return report


def _services(opts: DemoOptions, stack: ExitStack, console: Console) -> tuple[str, str | None]:
    """Broker and results URLs, starting embedded servers for whatever is not configured."""
    broker, results = opts.broker, opts.results
    if broker is None or (broker == "kafka" and results is None):
        redis_server = stack.enter_context(EmbeddedRedis())
        console.print(f"[dim]started embedded Redis at {redis_server.url}[/dim]")
        if broker is None:
            broker = redis_server.url
        else:
            results = redis_server.url
    if broker == "kafka":
        from batchfleet.connectors.embedded_kafka import EmbeddedKafka

        kafka = stack.enter_context(EmbeddedKafka())
        console.print(f"[dim]started embedded Kafka-compatible broker at {kafka.url}[/dim]")
        broker = kafka.url
    return broker, results


def run_demo(opts: DemoOptions) -> int:
    console = Console(stderr=opts.as_json)
    if opts.requests < 1:
        raise ConfigError("--requests must be at least 1")
    with ExitStack() as stack:
        broker, results = _services(opts, stack, console)
        worker = WorkerProcess(
            broker, results, models=(opts.model,), log_level="warning",
            extra_args=("--max-batch-size", str(opts.max_batch_size),
                        "--max-wait-ms", str(opts.max_wait_ms)))
        # removed after the worker stops (LIFO); a failed start quotes its tail first
        stack.callback(worker.log_path.unlink, missing_ok=True)
        stack.enter_context(worker)
        console.print(f"[dim]worker {worker.worker_id} warming up (log: {worker.log_path})[/dim]")
        worker.wait_ready()
        console.print(f"submitting {opts.requests:,} {opts.model} requests to {broker}")
        report = asyncio.run(drive(broker, results, opts.model, opts.requests, opts.timeout_s))
    summary = summary_with_context(report, opts, broker)
    if opts.as_json:
        print(json.dumps(summary))
    else:
        console.print(render_table(summary))
    if report.missing:
        console.print(f"[red]{report.missing} request(s) had no terminal result[/red]")
        return 1
    return 0


def summary_with_context(report: DemoReport, opts: DemoOptions, broker: str) -> dict[str, Any]:
    return {"model": opts.model, "broker": broker.split("://", maxsplit=1)[0],
            "max_batch_size": opts.max_batch_size, "max_wait_ms": opts.max_wait_ms,
            **report.summary()}


def render_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"batchfleet demo: {summary['model']} over {summary['broker']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    labels = {
        "requests": "requests", "succeeded": "succeeded", "failed": "failed",
        "expired": "expired", "missing": "missing (no terminal result)",
        "throughput_rps": "throughput (req/s)", "latency_p50_ms": "latency p50 (ms)",
        "latency_p95_ms": "latency p95 (ms)", "latency_p99_ms": "latency p99 (ms)",
        "mean_batch_size": "mean batch size", "mean_queue_ms": "mean queue wait (ms)",
    }
    for key, label in labels.items():
        value = summary[key]
        table.add_row(label, f"{value:,}" if isinstance(value, int) else f"{value:,.2f}")
    return table
