"""Baseline (c): the broker-only loop, the physical limit for small models on this machine.

Producer processes pipeline XADDs of request-sized payloads (the bytes of an
encoded demo-mlp request envelope) into one stream; one consumer process
XREADGROUPs up to a batch, then XACK+XDEL in one pipeline, with no decode, no
model and no result write. On Kafka, the same with aiokafka: producers send
batches and await their futures, one consumer ``getmany`` + ``commit`` per batch.
Producers keep at most ``window`` messages outstanding (produced minus consumed,
shared counters), like the fleet's closed loop, so the stream never grows
without bound. Throughput is what the consumer acknowledged inside the window.

Latency, to 1 ms, is each message's age when the consumer got it: the consumer's clock
against the entry ID's milliseconds (Redis stamps them at XADD) or the record's
timestamp (aiokafka stamps it at ``send``). With ``window`` messages outstanding it is a
closed loop's latency (about ``window`` / throughput), the broker's own at that depth:
what the fleet's Kafka tail is judged against where Tansu is the floor.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from batchfleet.bench.crew import Crew, member_loop, sleep_until
from batchfleet.bench.procstat import CpuMeter

_FIELD = b"p"  # the field name the SDK's XADD uses
_GROUP = "bench-broker-loop"
_PARTITIONS = 4  # the fleet's default --kafka-partitions


def request_payload(model: str = "demo-mlp") -> bytes:
    """One encoded request envelope as the SDK publishes it (ID, model, notify, tensor)."""
    from batchfleet.producers.client import new_request_id
    from batchfleet.schemas.envelopes import NOTIFY_RESULTS, Request, encode_request

    row = np.random.default_rng(7).random(10, dtype=np.float32)
    return encode_request(Request(request_id=new_request_id(), model=model, inputs=row,
                                  enqueued_at=time.time(),
                                  notify=f"client-{uuid.uuid4().hex[:12]}",
                                  notify_format=NOTIFY_RESULTS))


@dataclass(frozen=True, slots=True)
class _Spec:
    transport: str
    url: str
    target: str  # stream key or topic
    payload: bytes
    batch: int
    window: int
    warmup_s: float
    duration_s: float


def _redis_from(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def consumer_main(conn: Connection, spec: _Spec, consumed: Any) -> None:
    asyncio.run(member_loop(conn, lambda _cmd, start_at: _consume(spec, consumed, start_at)))


def producer_main(conn: Connection, spec: _Spec, produced: Any, index: int,
                  consumed: Any) -> None:
    asyncio.run(member_loop(conn, lambda _cmd, start_at: _produce(
        spec, produced, index, consumed, start_at)))


async def _consume(spec: _Spec, consumed: Any, start_at: Any) -> dict[str, Any]:
    #: (when, messages, where this batch's ages start in ``ages``) per batch
    stamps: list[tuple[float, int, int]] = []
    ages = array("i")
    if spec.transport == "kafka":
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            spec.target, bootstrap_servers=spec.url, group_id=_GROUP, enable_auto_commit=False,
            auto_offset_reset="earliest", max_poll_records=spec.batch)
        await consumer.start()
        try:
            while not consumer.assignment():  # join the group before the clock starts
                await consumer.getmany(timeout_ms=100)
            t0 = await start_at()
            stop_at = t0 + spec.warmup_s + spec.duration_s
            cpu0 = time.process_time()
            while time.time() < stop_at:
                got = await consumer.getmany(timeout_ms=5, max_records=spec.batch)
                n = sum(len(v) for v in got.values())
                if n:
                    await consumer.commit()
                    consumed.value += n
                    now = time.time()
                    now_ms = int(now * 1000)
                    stamps.append((now, n, len(ages)))
                    ages.extend(now_ms - record.timestamp
                                for records in got.values() for record in records)
            cpu = time.process_time() - cpu0
        finally:
            await consumer.stop()
        return {"stamps": stamps, "ages": ages, "cpu_s": cpu}
    r = _redis_from(spec.url)
    r.xgroup_create(spec.target, _GROUP, id="0", mkstream=True)
    t0 = await start_at()
    stop_at = t0 + spec.warmup_s + spec.duration_s
    cpu0 = time.process_time()
    streams = {spec.target: ">"}
    while time.time() < stop_at:
        got = r.xreadgroup(_GROUP, "c0", streams, count=spec.batch, block=5)
        if not got:
            continue
        ids = [entry_id for entry_id, _fields in got[0][1]]
        pipe = r.pipeline(transaction=False)
        pipe.xack(spec.target, _GROUP, *ids)
        pipe.xdel(spec.target, *ids)
        pipe.execute()
        consumed.value += len(ids)
        now = time.time()
        now_ms = int(now * 1000)
        stamps.append((now, len(ids), len(ages)))
        ages.extend(now_ms - int(entry_id.split(b"-", 1)[0]) for entry_id in ids)
    cpu = time.process_time() - cpu0
    r.close()
    return {"stamps": stamps, "ages": ages, "cpu_s": cpu}


async def _produce(spec: _Spec, produced: Any, index: int, consumed: Any,
                   start_at: Any) -> dict[str, Any]:
    def outstanding() -> int:
        return int(sum(produced[:]) - consumed.value)

    sent = 0
    if spec.transport == "kafka":
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=spec.url, acks="all",
                                    enable_idempotence=False, linger_ms=2)
        await producer.start()
        try:
            t0 = await start_at()
            stop_at = t0 + spec.warmup_s + spec.duration_s
            await asyncio.sleep(max(0.0, t0 - time.time()))
            cpu0 = time.process_time()
            while time.time() < stop_at:
                if outstanding() >= spec.window:
                    await asyncio.sleep(0.0005)
                    continue
                futures = [await producer.send(spec.target, spec.payload)
                           for _ in range(spec.batch)]
                await asyncio.gather(*futures)
                sent += spec.batch
                produced[index] = sent
            cpu = time.process_time() - cpu0
        finally:
            await producer.stop()
        return {"sent": sent, "cpu_s": cpu}
    return _produce_redis(spec, produced, index, outstanding, await start_at())


def _produce_redis(spec: _Spec, produced: Any, index: int, outstanding: Callable[[], int],
                   t0: float) -> dict[str, Any]:
    """Pipelined XADDs, a batch per round trip (sync: nothing else runs in this process)."""
    r = _redis_from(spec.url)
    stop_at = t0 + spec.warmup_s + spec.duration_s
    sleep_until(t0)
    cpu0 = time.process_time()
    fields = {_FIELD: spec.payload}
    sent = 0
    while time.time() < stop_at:
        if outstanding() >= spec.window:
            time.sleep(0.0005)
            continue
        pipe = r.pipeline(transaction=False)
        for _ in range(spec.batch):
            pipe.xadd(spec.target, fields)
        pipe.execute()
        sent += spec.batch
        produced[index] = sent
    cpu = time.process_time() - cpu0
    r.close()
    return {"sent": sent, "cpu_s": cpu}


def broker_loop(transport: str, url: str, server_pids: dict[str, int], *, batch: int,
                window: int, producers: int, warmup_s: float, duration_s: float,
                namespace: str) -> dict[str, Any]:
    """Run the loop once on ``transport``; messages/s acknowledged inside the window."""
    target = f"{namespace}-broker-loop"
    if transport == "kafka":
        from batchfleet.connectors.kafka_publisher import ensure_topics

        url = url.removeprefix("kafka://")
        asyncio.run(ensure_topics(url, [target], _PARTITIONS))
    payload = request_payload()
    spec = _Spec(transport, url, target, payload, batch, window, warmup_s, duration_s)
    ctx = multiprocessing.get_context("spawn")
    consumed = ctx.RawValue("q", 0)
    produced = ctx.RawArray("q", producers)
    with Crew(consumer_main, [(spec, consumed)], "broker-consumer") as cons, \
            Crew(producer_main, [(spec, produced, i, consumed) for i in range(producers)],
                 "broker-producer") as prods:
        cons.wait_up()
        prods.wait_up()
        meter = CpuMeter({"consumer": cons.pids, "client": prods.pids, **server_pids})
        # Consumer first (it joins its group before answering ready), then producers.
        # The window opens after the producers' ramp-up and closes when the consumer stops.
        t_cons = cons.start(["run"])
        t0 = prods.start(["run"] * producers)
        sleep_until(t0 + warmup_s)
        first = meter.snapshot(time.time())
        sleep_until(t_cons + warmup_s + duration_s - 0.01)
        last = meter.snapshot(time.time())
        consumer = cons.results()[0]
        sent = prods.results()
    inside = [(n, at) for t, n, at in consumer["stamps"] if first.wall <= t <= last.wall]
    window_n = sum(n for n, _ in inside)
    window_s = last.wall - first.wall
    batches = [n for n, _ in inside]
    ages = consumer["ages"]
    latency = message_ages([ages[at:at + n] for n, at in inside])
    cpu = CpuMeter.usage(first, last)
    if transport == "kafka":
        _delete_topic(url, target)
    return {
        "transport": transport, "payload_bytes": len(payload), "batch_size": batch,
        "window": window, "producers": producers,
        "msgs_per_s": round(window_n / window_s, 1) if window_s > 0 else 0.0,
        "messages": window_n, "window_s": round(window_s, 3),
        "mean_batch_size": round(window_n / len(batches), 2) if batches else 0.0,
        "produced": sum(s["sent"] for s in sent),
        "cpu_s": cpu,
        "cpu_util": {k: round(v / window_s, 3) for k, v in cpu.items()} if window_s > 0 else {},
        "consumer_cpu_us_per_msg": round(cpu.get("consumer", 0.0) / max(1, window_n) * 1e6, 2),
        "client_cpu_us_per_msg": round(cpu.get("client", 0.0) / max(1, window_n) * 1e6, 2),
        "latency_ms": latency,
    }


def message_ages(batches: list[Any]) -> dict[str, float]:
    """p50/p99/max of the messages' ages in ms (1 ms resolution); empty with none."""
    if not batches:
        return {}
    ages = np.concatenate([np.asarray(b, dtype=np.float64) for b in batches])
    if not len(ages):
        return {}
    p50, p99 = np.percentile(ages, [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1),
            "max": round(float(ages.max()), 1)}


def _delete_topic(bootstrap: str, topic: str) -> None:
    async def delete() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            await admin.start()
            await admin.delete_topics([topic])
        except Exception:  # cleanup only; Tansu may not support deletes
            pass
        finally:
            await admin.close()

    asyncio.run(delete())
