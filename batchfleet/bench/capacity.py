"""``bench --capacity``: what one request costs Redis, counted, next to the capacity model.

Why counts and not a scaling curve: on a shared 2-core box a throughput curve measures
the neighbours, while Redis's own counters are exact. ``capacity_run`` runs a real
worker and the SDK and reads ``INFO commandstats`` (commands run inside Lua scripts are
counted under their own names, so ``hsetnx`` counts pending records and ``publish``
announcements) and ``total_net_input/output_bytes``, with an idle window of the same
fleet as the background. :func:`predict_commands`, :func:`predict_bytes` and
:func:`predict_reads` are docs/scaling.md's single-node model (``capacity_cluster`` has
the cluster's); tests/integration/test_capacity_model.py holds the two together.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from batchfleet.bench.capacity_meter import METERS, Counts
from batchfleet.demo import demo_inputs
from batchfleet.producers.client import SUBMIT_CHUNK
from batchfleet.schemas.envelopes import (
    NOTIFY_RESULTS,
    Request,
    Result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.names import LANE_INTERACTIVE, Names

WAIT_TIMEOUT_S = 300.0
#: IDs per read when a client waits on IDs it did not submit (``_READ_CHUNK`` in
#: producers/waiting.py); the read phase's count would catch a change.
READ_CHUNK = 2000
#: Stream entry IDs as Redis makes them in a burst: 13-digit ms, '-', a sequence number
#: that counts up within a millisecond (a 1,000-entry XADD script reaches 3 digits).
ENTRY_ID_BYTES = 17
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
    #: A ``redis://`` or ``redis+cluster://`` URL; None: an embedded Redis, or with
    #: ``cluster`` a throwaway 3-primary cluster (``cluster_servers``).
    redis_url: str | None = None
    cluster: bool = False
    #: The clients' safety poll (the SDK's default). Every 10th poll re-reads every
    #: outstanding wait (a script call per 2,000 IDs, per slot group on a cluster, and an
    #: HMGET per ID): a run that spans one counts it on top of the request paths.
    poll_interval_s: float = 1.0


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

    submit, per chunk of C: 1 EVALSHA of the one-trip submit (per request HSETNX, one
    HSET of gen/body/notify, EXPIRE, XADD: ``connectors.redis_submit``, the results and the
    streams on one node), 1 admission pipeline (INFO memory + XLEN). write and ack, per
    batch: 1 EVALSHA (HMGET, HSET, EXPIRE per request; 1 PUBLISH per client; then XACK
    and XDEL: ``connectors.redis_finish``), so no MULTI or EXEC. read: nothing (the
    announcement carries the bodies).
    Fetches (XREADGROUP) are bounded separately."""
    chunks = chunks_of(n, clients)
    return {
        "evalsha": chunks + batches, "hsetnx": n, "hset": 2 * n, "expire": 2 * n,
        "xadd": n, "hmget": n, "publish": batches, "multi": 0, "xack": batches,
        "xdel": batches, "exec": 0, "info": chunks, "xlen": chunks,
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
    # Per request, each script call carries a two-byte index into its distinct tuples
    # (one per chunk or batch here), and the write the announcement it publishes.
    announced = _str_h(rid) + rid + _bin_h(sizes.result) + sizes.result
    into: float = (
        bulk(sizes.result_key) + bulk(sizes.pending) + 2  # submit: record
        + bulk(sizes.request)  # and payload
        + bulk(sizes.result_key) + bulk(sizes.result) + 2 + announced  # write_terminal
        + entry)  # the ack's entry ID, once for XACK and XDEL
    evalsha = command(7, 40, 4, 5)  # EVALSHA sha numkeys ttl, ~
    kind_pending = 1 + 1 + 1 + _str_h(16) + 16 + 1  # ["", "", client_id, stream index]
    kind_write = 1 + 1 + len("succeeded") + 1 + 1 + 1  # [status, channel, gen, pairs]
    meta_write = 1 + 1 + kind_write + 1 + _str_h(sizes.channel) + sizes.channel
    per_chunk = (evalsha + bulk(1) + bulk(stream)  # submit: + maxlen, the stream key
                 + bulk(1 + kind_pending) + bulk(0)  # the tuples, the indexes' framing
                 + command(4, 6) + command(4, stream))  # admission: INFO memory, XLEN
    per_batch = (evalsha + bulk(meta_write) + bulk(0) + bulk(sizes.inflight_prefix)
                 + bulk(2) + bulk(3)  # write_terminal: + the ID offset, the array header
                 + bulk(group) + bulk(stream)  # its ack: the group, the stream
                 + bulk(len(str(n // max(batches, 1)))))  # and its count of entry IDs
    per_fetch = command(10, 5, group, CONSUMER_BYTES, 5, 4, 5, 3, 7, stream, stream - 7,
                        1, 1)  # both lanes of the model
    into += (chunks * per_chunk + batches * per_batch + fetches * per_fetch) / n
    out: float = (
        4 + 4  # submit and write_terminal replies, one integer per key
        + 4 + entry + 4 + bulk(1) + bulk(sizes.request)  # XREADGROUP entry
        + _str_h(rid) + rid + _bin_h(sizes.result) + sizes.result)  # PUBLISH payload
    out += (batches * (6 + 4 + bulk(7) + bulk(sizes.channel) + 9)  # reply, message
            + fetches * (12 + bulk(stream))  # XREADGROUP reply head
            + chunks * INFO_MEMORY_BYTES) / n
    return {"in": into, "out": out}


def sizes_for(names: Names, model: str, client_id: str, sample: Result,
              request_ids: Sequence[str] = ()) -> Sizes:
    """The encoded sizes of a request like the SDK sends and a result like ``sample``;
    with ``request_ids``, the mean length of their result keys (on a cluster a key's
    hash tag is ``{r0}`` to ``{r15}``, so lengths differ by one)."""
    rid = uuid.uuid4().hex
    row = demo_inputs(model, 1)[0]
    req = Request(rid, model, row, LANE_INTERACTIVE, enqueued_at=time.time(), notify=client_id,
                  notify_format=NOTIFY_RESULTS)
    pending = Result(rid, "pending", model=model, enqueued_at=req.enqueued_at)
    sizes = Sizes(len(encode_request(req)), len(encode_result(pending)),
                  len(encode_result(sample)), len(rid), len(names.result(rid)),
                  len(names.notify_channel(client_id)),
                  len(names.stream(model, LANE_INTERACTIVE)), len(names.consumer_group),
                  len(names.inflight_prefix))
    if request_ids:
        mean = sum(len(names.result(i)) for i in request_ids) / len(request_ids)
        sizes = replace(sizes, result_key=round(mean))
    return sizes


@dataclass(frozen=True, slots=True)
class Measured:
    """One counted run, as the reports read it: counts summed over the primaries."""

    plan: CapacityPlan
    per_client: list[list[Result]]  # each client's results, in submit order
    counts: Counts  # the request phase
    idle: Counts  # the idle window before it
    elapsed_s: float
    sizes: Sizes
    memory: dict[str, float | None]

    @property
    def results(self) -> list[Result]:
        return [res for done in self.per_client for res in done]

    @property
    def scale(self) -> float:
        """The idle window's counts, stretched to the run's length."""
        return self.elapsed_s / self.plan.idle_s

    def background(self, command: str) -> float:
        return round(self.idle.get(command, 0) * self.scale, 1)

    def net_per_request(self, side: str) -> float:
        """Bytes ``in``/``out`` (or ``repl_out``) per request, the background removed."""
        key = side if side.startswith("repl") else f"net_{side}"
        return (self.counts[key] - self.idle[key] * self.scale) / len(self.results)


def others(counts: Counts, known: dict[str, Any]) -> Counts:
    """Commands outside the model (the background), meters and subcommands left out."""
    return {c: v for c, v in counts.items()
            if c not in known and c not in METERS and "|" not in c}


def common(run: Measured) -> dict[str, Any]:
    """What every report has, one Redis or a cluster: the run, the idle fleet's rate, the
    sizes, Redis CPU and memory."""
    plan, results, idle = run.plan, run.results, run.idle
    n = len(results)
    return {
        "requests": n, "clients": plan.clients, "chunk": SUBMIT_CHUNK,
        "elapsed_s": round(run.elapsed_s, 3),
        "succeeded": sum(res.status == "succeeded" for res in results),
        # one idle worker and client, per second: what a fleet costs Redis doing nothing
        "idle_per_s": {c: round(v / plan.idle_s, 1) for c, v in sorted(idle.items())
                       if "|" not in c and v},
        "sizes": {k: getattr(run.sizes, k) for k in Sizes.__slots__},
        "redis_cpu_us_per_request": round(
            (run.counts["cpu_us"] - idle["cpu_us"] * run.scale) / n, 2),
        "memory_bytes": {k: (None if v is None else round(v, 1))
                         for k, v in run.memory.items()},
        "plan": {"model": plan.model, "max_batch_size": plan.max_batch_size,
                 "max_wait_ms": plan.max_wait_ms, "idle_s": plan.idle_s},
    }


def report(run: Measured) -> dict[str, Any]:
    """Measured against predicted, per command and per request, with the background."""
    plan, counts = run.plan, run.counts
    results = run.results
    n = len(results)
    batches = round(sum(1.0 / (res.batch_size or 1) for res in results))
    rows: dict[str, dict[str, float]] = {
        command: {"predicted": predicted, "measured": counts.get(command, 0),
                  "background": run.background(command)}
        for command, predicted in predict_commands(n, batches, plan.clients).items()}
    bounds = {"publish": publish_bounds(batches, plan.clients),
              "xreadgroup": fetch_bounds(n, batches, plan.max_batch_size, run.elapsed_s),
              "xclaim": (0, 0)}
    for command, (low, high) in bounds.items():
        rows[command] = {"predicted_low": low, "predicted_high": high,
                         "measured": counts.get(command, 0),
                         "background": run.background(command)}
    fetches = counts.get("xreadgroup", 0)
    predicted_bytes = predict_bytes(n, batches, run.sizes, fetches, plan.clients)
    chunks = chunks_of(n, plan.clients)
    return {
        **common(run), "batches": batches, "mean_batch": round(n / batches, 1),
        "commands": rows, "other_commands": others(counts, rows),
        "bytes_per_request": {side: {"predicted": round(predicted_bytes[side], 1),
                                     "measured": round(run.net_per_request(side), 1)}
                              for side in ("in", "out")},
        "round_trips_per_request": {"submit": round(2 * chunks / n, 4),
                                    "worker": round((fetches + 2 * batches) / n, 4),
                                    "read": 0.0},
    }


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
