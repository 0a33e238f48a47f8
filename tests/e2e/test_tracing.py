"""Tracing with OpenTelemetry, against real servers: one trace spans producer and worker.

In-process, the SDK's ``InMemorySpanExporter`` collects both sides' spans; across
processes, a worker subprocess exports through the console exporter that
``OTEL_TRACES_EXPORTER=console`` names, and its spans carry the producer's trace ID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import timeit
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from batchfleet.connectors import tracing
from batchfleet.processes import WorkerProcess
from batchfleet.schemas.envelopes import Request, _traceparent, decode_request, encode_request
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.middleware.tracing import Tracing
from batchfleet.workers.settings import WorkerSettings
from tests.support.transports import Fleet, make_fleet

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into memory; decided again from the environment after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing._decided.clear()
        provider.shutdown()


@pytest.fixture
def redis_fleet(redis_url: str) -> Fleet:
    return make_fleet("redis", redis_url, None)


def by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def attr(span: ReadableSpan, key: str) -> Any:
    return dict(span.attributes or {})[key]


def test_tracing_is_off_without_otel_variables() -> None:
    assert not tracing.enabled_by({})
    assert not tracing.enabled_by({"OTEL_TRACES_EXPORTER": "none",
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"})
    assert tracing.enabled_by({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.enabled_by({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    tracing._decided.clear()
    try:
        assert tracing.tracer() is None  # the test environment sets no OTEL_* variable
        settings = WorkerSettings.from_url("redis://127.0.0.1:1/0", device="cpu")
        assert not any(isinstance(m, Tracing) for m in default_middleware(settings, [MODEL]))
    finally:
        tracing._decided.clear()


def test_traceparent_rides_the_envelope_and_a_bad_one_is_ignored() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    x = np.zeros(10, dtype=np.float32)
    assert decode_request(encode_request(Request("r1", MODEL, x, traceparent=tp))).traceparent == tp
    assert tracing.parse_traceparent(tp) == (0x0af7651916cd43dd8448eb211c80319c,
                                             0xb7ad6b7169203331, 1)
    for bad in ("", "00-abc", "ff" + tp[2:], tp.replace("0af7", "0AF7"),
                "00-" + "0" * 32 + "-b7ad6b7169203331-01"):
        assert tracing.parse_traceparent(bad) is None
    raw = encode_request(Request("r2", MODEL, x, traceparent="not a traceparent"))
    assert decode_request(raw).traceparent is None  # W3C: ignored, never an error
    assert decode_request(encode_request(Request("r3", MODEL, x))).traceparent is None


def test_off_costs_under_a_microsecond_per_request() -> None:
    """Tracing off, a request pays the client's ``is None`` check, the absent field on
    encode and its look-up on decode (measured here at about 0.2 µs together)."""
    tracer, body = None, {"id": "r1"}

    def per_request() -> Any:
        if tracer is not None:
            raise AssertionError
        encoded: dict[str, str] = {**({} if tracer is None else {"traceparent": tracer})}
        return encoded, _traceparent(body.get("traceparent"))

    n = 20_000
    cost = min(timeit.repeat(per_request, number=n, repeat=5)) / n
    assert cost < 1e-6, f"{cost * 1e9:.0f} ns per request with tracing off"


async def test_one_trace_spans_producer_and_worker(fleet: Fleet,
                                                   spans: InMemorySpanExporter) -> None:
    """Over Redis Streams and Kafka (where the traceparent is also a record header)."""
    x = np.random.default_rng(5).random((6, 10), dtype=np.float32)
    async with fleet.worker(max_batch_size=8) as worker, fleet.client() as client:
        assert worker.hooks.find(Tracing) is not None
        single = await client.submit(MODEL, x[0])
        many = await client.submit_many(MODEL, x[1:])
        results = await client.wait_many([single, *many], timeout=30)
        assert {r.status for r in results} == {"succeeded"}
    found = by_name(spans)
    submits = {attr(s, "batchfleet.request_id"): s for s in found["batchfleet.submit"]}
    assert set(submits) == {single, *many}
    waits = {attr(s, "batchfleet.request_id"): s for s in found["batchfleet.queue_wait"]}
    writes = {attr(s, "batchfleet.request_id"): s
              for s in found["batchfleet.result_write"]}
    assert set(waits) == set(writes) == set(submits)
    for rid, submit in submits.items():
        ctx = submit.context
        assert ctx is not None
        for worker_span in (waits[rid], writes[rid]):  # one trace: parented on the submit
            assert worker_span.context is not None and worker_span.parent is not None
            assert worker_span.context.trace_id == ctx.trace_id
            assert worker_span.parent.span_id == ctx.span_id
    # every request span is linked from exactly one compute span
    linked = [link.context.span_id for s in found["batchfleet.compute"] for link in s.links]
    assert sorted(linked) == sorted(s.context.span_id for s in submits.values()
                                    if s.context is not None)
    assert sum(attr(s, "batchfleet.batch_size") for s in found["batchfleet.compute"]) == 6


async def test_a_worker_process_exports_spans_with_the_producers_trace_id(
        redis_fleet: Fleet, spans: InMemorySpanExporter) -> None:
    proc = WorkerProcess(redis_fleet.broker, redis_fleet.results, namespace=redis_fleet.namespace,
                         env={"OTEL_TRACES_EXPORTER": "console",
                              "OTEL_SERVICE_NAME": "worker-under-test"},
                         log_level="debug").start()
    try:
        proc.wait_ready(60)
        async with redis_fleet.client() as client:
            rid = await client.submit(MODEL, np.ones(10, dtype=np.float32))
            assert (await client.wait(rid, timeout=30)).status == "succeeded"
    finally:
        assert proc.terminate() == 0
    submit = by_name(spans)["batchfleet.submit"][0]
    assert submit.context is not None
    log = proc.log_path.read_text()
    proc.log_path.unlink()
    trace_id = f"0x{submit.context.trace_id:032x}"
    exported = _console_spans(log)
    mine = [s for s in exported if s["context"]["trace_id"] == trace_id]
    assert {s["name"] for s in mine} == {"batchfleet.queue_wait", "batchfleet.result_write"}
    assert {s["resource"]["attributes"]["service.name"] for s in mine} == {"worker-under-test"}
    compute = [s for s in exported if s["name"] == "batchfleet.compute"]
    assert [link["context"]["trace_id"] for s in compute for link in s["links"]] == [trace_id]
    # log lines written inside the compute span name it
    lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"')]
    computed = [entry for entry in lines if entry.get("event") == "batch computed"]
    assert computed and computed[0]["trace_id"] == compute[0]["context"]["trace_id"][2:]
    assert computed[0]["span_id"] == compute[0]["context"]["span_id"][2:]


def _console_spans(text: str) -> list[dict[str, Any]]:
    """The console exporter's indented JSON objects, picked out of the interleaved log."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while (i := text.find('{\n    "name"', i)) >= 0:
        obj, end = decoder.raw_decode(text, i)
        out.append(obj)
        i = end
    return out


async def test_the_webhook_delivery_span_joins_the_requests_trace(
        redis_url: str, spans: InMemorySpanExporter) -> None:
    from rq import SimpleWorker

    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.connectors.webhook_jobs import DeliveryConfig, _configured, configure
    from batchfleet.connectors.webhook_queue import rq_queue
    from batchfleet.producers import AsyncClient
    from batchfleet.schemas.names import Names
    from tests.support.fleet import running_worker
    from tests.support.receiver import Receiver

    loopback = CallbackPolicy.parse("http", "", "127.0.0.0/8")
    receiver = Receiver().start()
    configure(DeliveryConfig("whsec-test", loopback, timeout_s=5))
    try:
        async with running_worker(redis_url, webhook_retry_intervals=(1,)), \
                AsyncClient(redis_url, callback_policy=loopback) as client:
            rid = await client.submit(MODEL, np.ones(10, np.float32), callback_url=receiver.url)
            assert (await client.wait(rid, timeout=30)).ok
        queue = rq_queue(redis_url, Names())
        worker = SimpleWorker([queue], connection=queue.connection)
        worker.work(burst=True)  # in this thread: RQ installs signal handlers
        assert len(receiver.wait_for(1, 20)) == 1
    finally:
        receiver.stop()
        _configured.clear()
    found = by_name(spans)
    (submit,), (webhook,) = found["batchfleet.submit"], found["batchfleet.webhook"]
    assert submit.context is not None and webhook.context is not None
    assert webhook.context.trace_id == submit.context.trace_id
    assert webhook.parent is not None and webhook.parent.span_id == submit.context.span_id
    assert attr(webhook, "batchfleet.request_id") == rid


@pytest.mark.kafka
async def test_kafka_records_carry_the_traceparent_header(kafka_broker: str) -> None:
    from aiokafka import AIOKafkaConsumer

    from batchfleet.connectors.broker import OutboundMessage
    from batchfleet.connectors.kafka_publisher import KafkaPublisher
    from batchfleet.schemas.names import Names

    names = Names(f"t{uuid.uuid4().hex[:10]}")
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    publisher = KafkaPublisher(kafka_broker, names, partitions=1)
    try:
        await publisher.publish([OutboundMessage(MODEL, "interactive", "r1", b"a", tp),
                                 OutboundMessage(MODEL, "interactive", "r2", b"b")])
    finally:
        await publisher.close()
    consumer = AIOKafkaConsumer(names.topic(MODEL, "interactive"), bootstrap_servers=kafka_broker,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        got: dict[str, Any] = {}
        while len(got) < 2:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got.update((r.key.decode(), list(r.headers)) for r in records)
    finally:
        await consumer.stop()
    assert got == {"r1": [("traceparent", tp.encode())], "r2": []}


_WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.logs import configure_logging
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.settings import WorkerSettings
try:
    configure_logging("json", "info")
    default_middleware(WorkerSettings.from_url("redis://127.0.0.1:1/0", device="cpu"), ["m"])
    AsyncClient("redis://127.0.0.1:1/0")
except ConfigError as exc:
    print("ConfigError:", exc)
else:
    print("untraced")
"""


@pytest.mark.parametrize(("exporter", "expected"), [
    ("", "untraced"),
    ("console", "ConfigError: OTEL_* variables turn tracing on, but the OpenTelemetry SDK is "
                "not installed: pip install 'batchfleet[otel]'"),
])
def test_without_the_otel_extra_nothing_imports_it(exporter: str, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if exporter:
        env["OTEL_TRACES_EXPORTER"] = exporter
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected
