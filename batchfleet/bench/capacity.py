"""``bench --capacity``: what one request costs Redis, counted, next to the capacity model.

Why counts and not a scaling curve: on a shared 2-core box a throughput curve measures
the neighbours, while Redis's own counters are exact. The run resets them (``CONFIG
RESETSTAT``), submits N requests with ``submit_many`` to a real worker process, waits
for every result, and reads ``INFO commandstats`` (commands run inside Lua scripts are
counted under their own names, so ``hsetnx`` counts pending records and ``publish``
announcements) and ``total_net_input/output_bytes``. An idle window of the same fleet,
read the same way first, is the background (heartbeats, policy reads, idle fetches) that
the request paths are measured on top of. :func:`predict_commands`,
:func:`predict_bytes` and :func:`predict_reads` are docs/scaling.md's model;
tests/integration/test_capacity_model.py holds the two together.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from batchfleet.bench.fleet import new_namespace, services, worker
from batchfleet.demo import demo_inputs
from batchfleet.producers import AsyncClient
from batchfleet.producers.client import SUBMIT_CHUNK
from batchfleet.schemas.envelopes import Request, Result, encode_request, encode_result
from batchfleet.schemas.names import LANE_INTERACTIVE, Names

WAIT_TIMEOUT_S = 300.0
#: IDs per read when a client waits on IDs it did not submit (``_READ_CHUNK`` in
#: producers/waiting.py); the read phase's count would catch a change.
READ_CHUNK = 2000
#: Stream entry IDs as Redis makes them in a burst: 13-digit ms, '-', a sequence number
#: that counts up within a millisecond (a 1,000-entry XADD script reaches 3 digits).
ENTRY_ID_BYTES = 17
#: What :func:`_counters` reads besides commands: net bytes in and out, Redis CPU.
METERS = ("net_in", "net_out", "cpu_us")
#: Worker IDs are ``w-`` and 8 hex digits: the consumer name in XREADGROUP.
CONSUMER_BYTES = 10
#: The ``INFO memory`` reply admission reads once per chunk (Redis 7.0: about 1.4 KB).
INFO_MEMORY_BYTES = 1400


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    requests: int = 20_000
    model: str = "demo-mlp"
    max_batch_size: int = 256
    max_wait_ms: float = 5.0
    #: Length of the idle window whose counts are the background.
    idle_s: float = 2.0
    #: Clients submitting (and waiting) concurrently, N split between them: a batch
    #: announces once per client with a request in it.
    clients: int = 1
    #: Read phase: ``get`` calls, then one ``wait_many`` on this many IDs from a client
    #: that did not submit them (no announcement comes to it: it reads).
    gets: int = 100
    foreign_waits: int = 1_000
    #: Requests queued with no worker, to weigh a queued request (0: skip).
    queued: int = 5_000
    redis_url: str | None = None


@dataclass(frozen=True, slots=True)
class Sizes:
    """Bytes of one request's pieces, from the SDK's and the worker's own encoders."""

    request: int  # the XADD payload (request envelope)
    pending: int  # the pending result body put_pending stores
    result: int  # the terminal result body the worker stores and announces
    request_id: int
    result_key: int  # {ns}:result:{id}
    channel: int  # {ns}:notify:{client}
    stream: int  # {ns}:stream:{model}:{lane}
    group: int  # {ns}-workers
    inflight_prefix: int  # {ns}:inflight:


def bulk(n: int) -> int:
    """RESP bulk string of n bytes: ``$n\\r\\n`` + data + ``\\r\\n``."""
    return n + len(str(n)) + 5


def _str_h(n: int) -> int:
    return 1 if n < 32 else 2 if n < 256 else 3


def _bin_h(n: int) -> int:
    return 2 if n < 256 else 3


def chunks_of(n: int, clients: int = 1, chunk: int = SUBMIT_CHUNK) -> int:
    """``submit_many`` chunks when N is split evenly over the clients."""
    return sum(math.ceil(len(range(i, n, clients)) / chunk) for i in range(clients))


def predict_commands(n: int, batches: int, clients: int = 1) -> dict[str, float]:
    """Commands the request paths cost for N requests in K batches (one client; with
    more, PUBLISH is bounded by :func:`publish_bounds`).

    submit, per chunk of C: 1 EVALSHA put_pending (HSETNX, HSET gen/body, HSET notify,
    EXPIRE per request), 1 EVALSHA XADD-many (XADD per request), 1 admission pipeline
    (INFO memory + XLEN). write, per batch: 1 EVALSHA (HMGET, HSET, EXPIRE per request;
    1 PUBLISH per client). ack, per batch: MULTI, XACK, XDEL, EXEC. read: nothing (the
    announcement carries the bodies). Fetches (XREADGROUP) are bounded separately."""
    chunks = chunks_of(n, clients)
    return {
        "evalsha": 2 * chunks + batches, "hsetnx": n, "hset": 3 * n, "expire": 2 * n,
        "xadd": n, "hmget": n, "publish": batches, "multi": batches, "xack": batches,
        "xdel": batches, "exec": batches, "info": chunks, "xlen": chunks,
    }


def publish_bounds(batches: int, clients: int) -> tuple[int, int]:
    """One PUBLISH per (batch, client with a request in it)."""
    return batches, batches * clients


def predict_reads(gets: int, foreign: int) -> dict[str, int]:
    """``get``: 1 EVALSHA (1 HMGET) each. A wait on IDs this client did not submit: one
    EVALSHA per 2,000 IDs (its first read), 1 HMGET per ID; its own are announced."""
    return {"evalsha": gets + math.ceil(foreign / READ_CHUNK), "hmget": gets + foreign}


def fetch_bounds(n: int, batches: int, max_batch_size: int, elapsed_s: float,
                 prefetch_batches: int = 2, fetch_timeout_s: float = 0.1) -> tuple[int, int]:
    """XREADGROUP calls: at least one per ``prefetch x max_batch_size`` entries, at most
    one per batch plus one per idle ``fetch_timeout`` (an empty blocking read)."""
    low = math.ceil(n / (prefetch_batches * max_batch_size))
    return low, batches + math.ceil(elapsed_s / fetch_timeout_s) + 1


def command(*lengths: int) -> int:
    """RESP bytes of a command whose arguments have these lengths."""
    return len(f"*{len(lengths)}\r\n") + sum(bulk(n) for n in lengths)


def predict_bytes(n: int, batches: int, sizes: Sizes, fetches: int, clients: int = 1
                  ) -> dict[str, float]:
    """Bytes into and out of Redis per request, from RESP framing of the calls above:
    what scales with N (keys, bodies, payloads, entry IDs), plus each call's fixed part
    spread over its chunk, batch or fetch."""
    chunks = chunks_of(n, clients)
    entry = bulk(ENTRY_ID_BYTES)
    rid, stream, group = sizes.request_id, sizes.stream, sizes.group
    meta_pending = 1 + 1 + 1 + _str_h(16) + 16  # ["", "", client_id]
    meta_write = 1 + _str_h(rid) + rid + 10 + _str_h(sizes.channel) + sizes.channel + 1
    into: float = (
        bulk(sizes.result_key) + bulk(sizes.pending) + meta_pending  # put_pending
        + bulk(sizes.request)  # XADD-many
        + bulk(sizes.result_key) + bulk(sizes.result) + meta_write  # write_terminal
        + 2 * entry)  # XACK + XDEL
    evalsha = command(7, 40, 4, 5, 8)  # EVALSHA sha numkeys ttl meta(header), ~
    per_chunk = (evalsha + command(7, 40, 1, stream, 1, 4)  # put_pending, XADD-many
                 + command(4, 6) + command(4, stream))  # admission: INFO memory, XLEN
    per_batch = (evalsha + bulk(sizes.inflight_prefix)  # write_terminal
                 + command(5) + command(4, stream, group) + command(4, stream)
                 + command(4))  # MULTI XACK XDEL EXEC
    per_fetch = command(10, 5, group, CONSUMER_BYTES, 5, 4, 5, 3, 7, stream, stream - 7,
                        1, 1)  # both lanes of the model
    into += (chunks * per_chunk + batches * per_batch + fetches * per_fetch) / n
    out: float = (
        4 + 4  # put_pending and write_terminal replies, one integer per key
        + 4 + entry + 4 + bulk(1) + bulk(sizes.request)  # XREADGROUP entry
        + _str_h(rid) + rid + _bin_h(sizes.result) + sizes.result)  # PUBLISH payload
    out += (batches * (37 + 6 + 4 + bulk(7) + bulk(sizes.channel) + 9)  # replies, message
            + fetches * (12 + bulk(stream))  # XREADGROUP reply head
            + chunks * INFO_MEMORY_BYTES) / n
    return {"in": into, "out": out}


def sizes_for(names: Names, model: str, client_id: str, sample: Result) -> Sizes:
    """The encoded sizes of a request like the SDK sends and a result like ``sample``."""
    rid = uuid.uuid4().hex
    row = demo_inputs(model, 1)[0]
    req = Request(rid, model, row, LANE_INTERACTIVE, enqueued_at=time.time(), notify=client_id)
    pending = Result(rid, "pending", model=model, enqueued_at=req.enqueued_at)
    return Sizes(len(encode_request(req)), len(encode_result(pending)), len(encode_result(sample)),
                 len(rid), len(names.result(rid)), len(names.notify_channel(client_id)),
                 len(names.stream(model, LANE_INTERACTIVE)), len(names.consumer_group),
                 len(names.inflight_prefix))


async def _counters(r: aioredis.Redis) -> dict[str, int]:
    """Calls per command, plus ``net_in``/``net_out`` bytes, since the last RESETSTAT."""
    stats = await r.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    net, cpu = await r.info("stats"), await r.info("cpu")
    out["net_in"], out["net_out"] = (int(net["total_net_input_bytes"]),
                                     int(net["total_net_output_bytes"]))
    # Redis's own CPU, networking included (cumulative: only differences mean anything).
    # Not commandstats' usec: a script's time is counted again under each inner command.
    out["cpu_us"] = int((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6)
    return out


async def _used_memory(r: aioredis.Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def _queued_bytes(r: aioredis.Redis, url: str, model: str, n: int) -> float:
    """Memory per queued request: N submitted where no worker reads (pending record +
    stream entry), then deleted."""
    names = Names(new_namespace("capacity-q"))
    before = await _used_memory(r)
    async with AsyncClient(url, namespace=names.prefix, check_model=False) as client:
        ids = await client.submit_many(model, list(demo_inputs(model, n, seed=3)))
        grown = (await _used_memory(r) - before) / n
    await r.unlink(names.stream(model, LANE_INTERACTIVE), *(names.result(i) for i in ids))
    return grown


async def measure_capacity(plan: CapacityPlan) -> dict[str, Any]:
    """Run the fleet, count, and return measured and predicted costs (JSON-ready)."""
    with services(plan.redis_url, None, False) as svc:
        ns = new_namespace("capacity")
        with worker(svc, "redis", plan.model, plan.max_batch_size, plan.max_wait_ms, ns):
            return await _measure(plan, svc.redis_url, Names(ns))


async def _measure(plan: CapacityPlan, url: str, names: Names) -> dict[str, Any]:
    r = aioredis.Redis.from_url(url)
    clients = [AsyncClient(url, namespace=names.prefix) for _ in range(plan.clients)]
    try:
        warm = [await c.submit_many(plan.model, list(demo_inputs(plan.model, 8)))
                for c in clients]
        sample = (await clients[0].wait_many(warm[0], WAIT_TIMEOUT_S))[0]
        for c, ids in zip(clients[1:], warm[1:], strict=True):
            await c.wait_many(ids, WAIT_TIMEOUT_S)
        await r.config_resetstat()
        cpu_idle = await _counters(r)
        await asyncio.sleep(plan.idle_s)
        idle = await _counters(r)
        idle["cpu_us"] -= cpu_idle["cpu_us"]
        inputs = list(demo_inputs(plan.model, plan.requests))
        mem_before = await _used_memory(r)
        await r.config_resetstat()
        cpu_start = (await _counters(r))["cpu_us"]
        start = time.perf_counter()
        per_client = await asyncio.gather(*(
            _submit_and_wait(c, plan.model, inputs[i::plan.clients])
            for i, c in enumerate(clients)))
        await _until_acked(r, names.stream(plan.model, LANE_INTERACTIVE))
        elapsed = time.perf_counter() - start
        counts = await _counters(r)
        counts["cpu_us"] -= cpu_start
        mem_after = await _used_memory(r)
        results = [res for done in per_client for res in done]
        ids = [res.request_id for res in results]
        sizes = sizes_for(names, plan.model, clients[0].client_id, sample)
        reads = await _read_phase(r, url, names, clients[0], ids, plan)
        stored = int(await r.memory_usage(names.result(ids[-1])) or 0)
        queued = await _queued_bytes(r, url, plan.model, plan.queued) if plan.queued else None
    finally:
        for c in clients:
            await c.close()
        await r.aclose()
    found = report(plan, results, counts, idle, elapsed, sizes,
                   {"per_result_used_memory": (mem_after - mem_before) / plan.requests,
                    "per_result_memory_usage": stored, "per_queued_request": queued})
    found["reads"] = reads
    return found


async def _until_acked(r: aioredis.Redis, stream: str) -> None:
    """A result is announced before its entry is acked (write first, then ack): wait for
    the last acks, so every batch's are counted. XINFO is no command of the model."""
    for _ in range(int(WAIT_TIMEOUT_S / 0.01)):
        if all(int(g["pending"]) == 0 for g in await r.xinfo_groups(stream)):
            return
        await asyncio.sleep(0.01)


async def _submit_and_wait(client: AsyncClient, model: str, inputs: list[Any]) -> list[Result]:
    return await client.wait_many(await client.submit_many(model, inputs), WAIT_TIMEOUT_S)


async def _read_phase(r: aioredis.Redis, url: str, names: Names, client: AsyncClient,
                      ids: list[str], plan: CapacityPlan) -> dict[str, Any]:
    """``get`` on some results, then a second client's ``wait_many`` on others, counted."""
    gets, foreign = min(plan.gets, len(ids)), min(plan.foreign_waits, len(ids))
    async with AsyncClient(url, namespace=names.prefix) as other:
        await other.known_models()  # its connections open outside the counted window
        await r.config_resetstat()
        for rid in ids[:gets]:
            await client.get(rid)
        await other.wait_many(ids[-foreign:], WAIT_TIMEOUT_S)
        counts = await _counters(r)
    predicted = predict_reads(gets, foreign)
    return {"gets": gets, "foreign_waits": foreign,
            "commands": {c: {"predicted": v, "measured": counts.get(c, 0)}
                         for c, v in predicted.items()},
            "other_commands": _others(counts, predicted),
            "bytes_out_per_read": round(counts["net_out"] / (gets + foreign), 1)}


def _others(counts: dict[str, int], known: dict[str, Any]) -> dict[str, int]:
    return {c: v for c, v in counts.items()
            if c not in known and c not in METERS and "|" not in c}


def report(plan: CapacityPlan, results: list[Result], counts: dict[str, int],
           idle: dict[str, int], elapsed_s: float, sizes: Sizes, memory: dict[str, Any]
           ) -> dict[str, Any]:
    """Measured against predicted, per command and per request, with the background."""
    n = len(results)
    batches = round(sum(1.0 / (res.batch_size or 1) for res in results))
    scale = elapsed_s / plan.idle_s  # the idle window's counts, stretched to the run

    def background(command: str) -> float:
        return round(idle.get(command, 0) * scale, 1)

    rows: dict[str, dict[str, float]] = {
        command: {"predicted": predicted, "measured": counts.get(command, 0),
                  "background": background(command)}
        for command, predicted in predict_commands(n, batches, plan.clients).items()}
    bounds = {"publish": publish_bounds(batches, plan.clients),
              "xreadgroup": fetch_bounds(n, batches, plan.max_batch_size, elapsed_s),
              "xclaim": (0, 0)}
    for command, (low, high) in bounds.items():
        rows[command] = {"predicted_low": low, "predicted_high": high,
                         "measured": counts.get(command, 0), "background": background(command)}
    fetches = counts.get("xreadgroup", 0)
    predicted_bytes = predict_bytes(n, batches, sizes, fetches, plan.clients)
    measured_bytes = {side: (counts[f"net_{side}"] - idle[f"net_{side}"] * scale) / n
                      for side in ("in", "out")}
    chunks = chunks_of(n, plan.clients)
    return {
        "requests": n, "batches": batches, "mean_batch": round(n / batches, 1),
        "clients": plan.clients, "chunk": SUBMIT_CHUNK, "elapsed_s": round(elapsed_s, 3),
        "succeeded": sum(res.status == "succeeded" for res in results),
        "commands": rows, "other_commands": _others(counts, rows),
        # one idle worker and client, per second: what a fleet costs Redis doing nothing
        "idle_per_s": {c: round(v / plan.idle_s, 1) for c, v in sorted(idle.items())
                       if "|" not in c and v},
        "sizes": {k: getattr(sizes, k) for k in Sizes.__slots__},
        "bytes_per_request": {side: {"predicted": round(predicted_bytes[side], 1),
                                     "measured": round(measured_bytes[side], 1)}
                              for side in ("in", "out")},
        "redis_cpu_us_per_request": round(
            (counts["cpu_us"] - idle["cpu_us"] * scale) / n, 2),
        "round_trips_per_request": {"submit": round(3 * chunks / n, 4),
                                    "worker": round((fetches + 2 * batches) / n, 4),
                                    "read": 0.0},
        "memory_bytes": {k: (None if v is None else round(v, 1)) for k, v in memory.items()},
        "plan": {"model": plan.model, "max_batch_size": plan.max_batch_size,
                 "max_wait_ms": plan.max_wait_ms, "idle_s": plan.idle_s},
    }


def run_capacity(plan: CapacityPlan) -> dict[str, Any]:
    return asyncio.run(measure_capacity(plan))


def render(found: dict[str, Any]) -> str:
    """The tables docs/scaling.md quotes."""
    n, k = found["requests"], found["batches"]
    lines = [f"{n:,} requests ({found['succeeded']:,} succeeded) from {found['clients']} "
             f"client(s) in {k:,} batches "
             f"(mean {found['mean_batch']}), submit_many chunks of {found['chunk']}, "
             f"{found['elapsed_s']} s", "",
             "| command | predicted | measured | idle background | measured per request |",
             "|---|---:|---:|---:|---:|"]
    for command, row in found["commands"].items():
        pred = (f"{row['predicted']:,}" if "predicted" in row else
                f"{row['predicted_low']:,}" if row["predicted_low"] == row["predicted_high"]
                else f"{row['predicted_low']:,}..{row['predicted_high']:,}")
        lines.append(f"| {command} | {pred} | {row['measured']:,} | {row['background']:,} "
                     f"| {row['measured'] / n:.4f} |")
    reads = found.get("reads")
    if reads:
        lines += ["", f"Read phase: {reads['gets']} get() calls, then a wait_many on "
                  f"{reads['foreign_waits']} IDs from a client that did not submit them "
                  f"({reads['bytes_out_per_read']} B out per read).", "",
                  "| command | predicted | measured |", "|---|---:|---:|"]
        lines += [f"| {c} | {row['predicted']:,} | {row['measured']:,} |"
                  for c, row in reads["commands"].items()]
    others = ", ".join(f"{c} {v}" for c, v in sorted(found["other_commands"].items()))
    lines += ["", f"Other commands (background): {others or 'none'}", "",
              "| bytes per request | predicted | measured (background removed) |",
              "|---|---:|---:|"]
    for side, row in found["bytes_per_request"].items():
        lines.append(f"| {side} | {row['predicted']:,} | {row['measured']:,} |")
    rt, mem = found["round_trips_per_request"], found["memory_bytes"]
    lines += ["", f"Redis CPU per request: {found['redis_cpu_us_per_request']} us "
              "(INFO cpu, user + sys, idle background removed).",
              f"Round trips per request: submit {rt['submit']}, worker {rt['worker']}, "
              f"read {rt['read']} (one-hop announcements).",
              f"Memory: {mem['per_result_used_memory']} B per retained result (used_memory), "
              f"{mem['per_result_memory_usage']} B (MEMORY USAGE of one record), "
              f"{mem['per_queued_request']} B per queued request.", ""]
    return "\n".join(lines)
