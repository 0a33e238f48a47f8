"""``bench --capacity`` on Redis Cluster: the model's counts per primary, read off the code.

What a cluster changes (``connectors/cluster_store.py``, ``cluster_streams.py``,
``redis_pressure.py``):

* every script is ``EVAL``, with its text each call, never ``EVALSHA``;
* a result-store script runs once per slot group, all groups in one pipeline. Result
  keys carry one of 16 hash tags, so a submit chunk or a batch costs G calls, G being
  the distinct tags among its request IDs: E[G(n)] = 16·(1 - (15/16)^n), which is 16.0
  for a 1,000-request chunk, 15.9 for a batch of 256 and 10.3 for a batch of 16;
* the terminal write cannot publish (the client's channel lies in another slot), so a
  second pipelined step sends one ``SPUBLISH`` per client channel, bodies included:
  the bodies go into Redis as well as out of it;
* the ack is one script per stream (``XACK`` + ``XDEL`` inside), with no MULTI/EXEC;
* a fetch is one ``XREADGROUP`` per slot group of the streams read, first without
  blocking and, only when all are empty, again blocking at most 20 ms. A demo-mlp
  worker reads four streams (both lanes of ``demo-mlp`` and of its version lane
  ``demo-mlp@default``), each with its own tag: four calls, or eight when idle;
* admission reads ``INFO memory`` from every primary, after a pipelined ``XLEN``.

The prediction is exact, not an expected value. The run knows every request ID, and so
its tag, slot and primary. It knows the chunk each ID was submitted in, and the batch
it ran in, from its result's ``started_at``, which the worker stamps once per batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchfleet.bench.capacity import (
    CONSUMER_BYTES,
    ENTRY_ID_BYTES,
    INFO_MEMORY_BYTES,
    Measured,
    Sizes,
    bulk,
    command,
    common,
    others,
)
from batchfleet.bench.capacity_meter import METERS, Counts, Meter
from batchfleet.connectors import cluster_store, cluster_streams, redis_streams, result_store
from batchfleet.producers.client import SUBMIT_CHUNK
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.names import LANE_INTERACTIVE, RESULT_TAGS, Names, result_tag

#: Script texts as they go over the wire with each ``EVAL``.
PUT_PENDING_BYTES = len(result_store.PUT_PENDING_SCRIPT)
WRITE_BYTES = len(cluster_store.WRITE_TERMINAL_SLOT_SCRIPT)
XADD_BYTES = len(redis_streams.XADD_MANY_SCRIPT)
ACK_BYTES = len(redis_streams.ACK_DEL_SCRIPT)
#: Commands the request paths no longer use on a cluster (predicted 0).
GONE = ("evalsha", "publish", "multi", "exec")


def expected_groups(n: float, tags: int = RESULT_TAGS) -> float:
    """Expected distinct tags among n random IDs: script calls per chunk or batch."""
    return tags * (1 - math.pow(1 - 1 / tags, n))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where things live: each slot's primary, the two lane streams', each client's channel."""

    node_of_slot: Callable[[int], str]
    primaries: tuple[str, ...]
    stream: str  # the interactive lane's stream, where the requests go
    reads: tuple[tuple[str, str], ...]  # (stream, node) of every stream the worker reads
    channels: tuple[str, ...]  # per client
    control: str  # the control-plane tag {ns}: heartbeats, registry, …

    def node_of(self, key: str) -> str:
        (slot,) = cluster_store.slot_groups([key])
        return self.node_of_slot(slot)

    def groups(self, keys: Sequence[str]) -> Counter[str]:
        """Script calls per node for one per-slot-group call over ``keys``."""
        return Counter(self.node_of_slot(s) for s in cluster_store.slot_groups(keys))


@dataclass(frozen=True, slots=True)
class Batch:
    keys: list[str]  # result keys
    clients: frozenset[int]  # clients with a request in it


def batches_of(per_client: Sequence[Sequence[Result]], key: Callable[[str], str]
               ) -> list[Batch]:
    """The worker's batches, rebuilt from results: one ``started_at`` per batch run."""
    found: dict[tuple[float | None, int | None], tuple[list[str], set[int]]] = {}
    for client, results in enumerate(per_client):
        for res in results:
            keys, clients = found.setdefault((res.started_at, res.batch_size), ([], set()))
            keys.append(key(res.request_id))
            clients.add(client)
    return [Batch(keys, frozenset(clients)) for keys, clients in found.values()]


def predict_per_node(chunks: Sequence[Sequence[str]], batches: Sequence[Batch],
                     layout: Layout) -> dict[str, Counter[str]]:
    """Commands per primary for these submit chunks (result keys) and batches.

    Per chunk: a put-pending ``EVAL`` per slot group (``HSETNX``, one ``HSET``,
    ``EXPIRE`` per key, on the key's primary); 1 XADD-many ``EVAL`` (``XADD`` per
    request) and 1 ``XLEN`` on the stream's primary; 1 ``INFO`` on every primary. Per
    batch: a write ``EVAL`` per slot group (``HMGET``, ``HSET``, ``EXPIRE`` per key); 1
    ``SPUBLISH`` per client in it, on its channel's primary; 1 ack ``EVAL`` (``XACK``,
    ``XDEL``) on the stream's primary."""
    out: dict[str, Counter[str]] = {p: Counter() for p in layout.primaries}
    for chunk in chunks:
        for node, calls in layout.groups(chunk).items():
            out[node]["eval"] += calls
        for key in chunk:
            row = out[layout.node_of(key)]
            row["hsetnx"] += 1
            row["hset"] += 1
            row["expire"] += 1
        out[layout.stream].update({"eval": 1, "xadd": len(chunk), "xlen": 1})
        for p in layout.primaries:
            out[p]["info"] += 1
    for batch in batches:
        for node, calls in layout.groups(batch.keys).items():
            out[node]["eval"] += calls
        for key in batch.keys:
            out[layout.node_of(key)].update(("hmget", "hset", "expire"))
        out[layout.stream].update(("eval", "xack", "xdel"))
        for client in batch.clients:
            out[layout.channels[client]]["spublish"] += 1
    return out


def fetch_bounds(layout: Layout, n: int, batches: int, max_batch_size: int,
                 elapsed_s: float, prefetch_batches: int = 2) -> dict[str, tuple[int, int]]:
    """``XREADGROUP`` per primary: each fetch reads every stream, one call per slot
    group. At least one fetch per ``prefetch x max_batch_size`` entries; at most one per
    batch plus, while idle, two per 20 ms (a read without blocking, then the capped
    block)."""
    low = math.ceil(n / (prefetch_batches * max_batch_size))
    high = batches + 2 * (math.ceil(elapsed_s * 1000 / cluster_streams.CLUSTER_BLOCK_MS) + 1)
    out: dict[str, tuple[int, int]] = {p: (0, 0) for p in layout.primaries}
    for node in Counter(node for _, node in layout.reads).elements():
        lo, hi = out[node]
        out[node] = (lo + low, hi + high)
    return out


def predict_reads(gets: int, foreign: Sequence[str], layout: Layout, chunk: int = 2000
                  ) -> dict[str, int]:
    """``get``: 1 ``EVAL`` (1 ``HMGET``) each; a wait on IDs another client submitted:
    per 2,000 IDs, 1 ``EVAL`` per slot group; 1 ``HMGET`` per ID."""
    groups = sum(sum(layout.groups(foreign[i:i + chunk]).values())
                 for i in range(0, len(foreign), chunk))
    return {"eval": gets + groups, "hmget": gets + len(foreign)}


@dataclass(frozen=True, slots=True)
class Calls:
    """How many calls of each kind the run made (the per-call fixed bytes)."""

    chunks: int
    put: int  # put-pending EVALs (slot groups over the chunks)
    batches: int
    write: int  # write EVALs (slot groups over the batches)
    spublish: int
    fetches: int  # XREADGROUP calls, one per stream read
    primaries: int
    read_stream: float  # mean length of the names of the streams read


def predict_bytes(n: int, sizes: Sizes, calls: Calls) -> dict[str, float]:
    """Bytes into and out of the primaries per request (replication apart), from the RESP
    framing of the calls above. Per request: what single-node Redis gets (key, body and
    metadata in, reply and stream entry out), plus each body again, into Redis in the
    ``SPUBLISH``. Per call: the script text of each ``EVAL``."""
    k, p, r, s, rid = (sizes.result_key, sizes.pending, sizes.request, sizes.result,
                       sizes.request_id)
    entry = bulk(ENTRY_ID_BYTES)
    item = (1 if rid < 32 else 2) + rid + (2 if s < 256 else 3) + s  # [id, body] in msgpack
    into: float = (bulk(k) + bulk(p) + 20  # put-pending: key, body, (owner, fp, notify)
            + bulk(r)  # XADD-many: the payload
            + bulk(k) + bulk(s) + 12  # write: key, body, (status, gen)
            + item  # SPUBLISH: the bodies go in too
            + entry)  # ack: entry IDs once (XACK and XDEL share ARGV)
    into += (calls.put * command(4, PUT_PENDING_BYTES, 2, 5, 3)
             + calls.chunks * (command(4, XADD_BYTES, 1, sizes.stream, 1, 4)
                               + command(4, sizes.stream)
                               + calls.primaries * command(4, 6))  # XLEN, INFO memory
             + calls.write * command(4, WRITE_BYTES, 2, 5, 3)
             + calls.spublish * command(8, sizes.channel, 3)
             + calls.batches * command(4, ACK_BYTES, 1, sizes.stream, sizes.group)
             + calls.fetches * (command(10, 5, sizes.group, CONSUMER_BYTES, 5, 3, 5, 2, 7,
                                         1) + bulk(round(calls.read_stream)))) / n
    out: float = (4 + 6  # put-pending reply :0, write reply $0 (no owner)
           + 4 + entry + 4 + bulk(1) + bulk(r)  # XREADGROUP entry
           + item)  # the announcement, to the subscriber
    out += (calls.put * 5 + calls.write * 5 + calls.batches * 6  # array heads, XDEL count
            + calls.chunks * (7 + 5 + calls.primaries * INFO_MEMORY_BYTES)  # XADD, XLEN, INFO
            + calls.spublish * (4 + 4 + bulk(8) + bulk(sizes.channel) + 8 + 3)
            + calls.batches * (12 + bulk(sizes.stream))  # a fetch reply's head
            + calls.fetches * 5) / n  # a nil (timed-out) read
    return {"in": into, "out": out}


async def layout_for(meter: Meter, names: Names, model: str, client_ids: Sequence[str]
                     ) -> Layout:
    """Where this run's streams, channels and control plane live on ``meter``'s cluster.
    The streams the worker reads are the namespace's streams: it created them."""
    def node(key: str) -> str:
        (slot,) = cluster_store.slot_groups([key])
        return meter.node_of_slot(slot)
    streams = await meter.streams(f"{names.prefix}:stream:*")
    return Layout(meter.node_of_slot, tuple(meter.primaries),
                  node(names.stream(model, LANE_INTERACTIVE)),
                  tuple((s, node(s)) for s in streams),
                  tuple(node(names.notify_channel(c)) for c in client_ids),
                  node(names.model_registry))


#: The request paths' commands, in the order the tables list them.
ORDER = ("eval", "hsetnx", "hset", "expire", "xadd", "hmget", "spublish", "xack", "xdel",
         "info", "xlen")


def cluster_report(run: Measured, layout: Layout, names: Names, per_node: dict[str, Counts],
                   idle_node: dict[str, Counts], replicas: Sequence[str]) -> dict[str, Any]:
    """Predicted against measured, summed over the primaries and per primary."""
    plan, counts = run.plan, run.counts
    n = len(run.results)
    chunks = [[names.result(res.request_id) for res in done[i:i + SUBMIT_CHUNK]]
              for done in run.per_client for i in range(0, len(done), SUBMIT_CHUNK)]
    batches = batches_of(run.per_client, names.result)
    k = len(batches)
    predicted = predict_per_node(chunks, batches, layout)
    total: Counter[str] = Counter()
    for row in predicted.values():
        total.update(row)
    rows: dict[str, dict[str, float]] = {
        c: {"predicted": total[c], "measured": counts.get(c, 0),
            "background": run.background(c)} for c in (*ORDER, *GONE)}
    bounds = fetch_bounds(layout, n, k, plan.max_batch_size, run.elapsed_s)
    rows["xreadgroup"] = {"predicted_low": sum(lo for lo, _ in bounds.values()),
                          "predicted_high": sum(hi for _, hi in bounds.values()),
                          "measured": counts.get("xreadgroup", 0),
                          "background": run.background("xreadgroup")}
    rows["xclaim"] = {"predicted_low": 0, "predicted_high": 0,
                      "measured": counts.get("xclaim", 0), "background": run.background("xclaim")}
    put = sum(sum(layout.groups(c).values()) for c in chunks)
    write = sum(sum(layout.groups(b.keys).values()) for b in batches)
    fetches = counts.get("xreadgroup", 0)
    calls = Calls(len(chunks), put, k, write, total["spublish"], fetches, len(layout.primaries),
                  sum(len(s) for s, _ in layout.reads) / max(1, len(layout.reads)))
    bytes_ = predict_bytes(n, run.sizes, calls)
    submit_trips = sum(len(layout.groups(c)) + 2 + len(layout.primaries) for c in chunks)
    worker_trips = fetches + sum(len(layout.groups(b.keys)) + 1 + len(
        {layout.channels[c] for c in b.clients}) for b in batches)
    return {
        **common(run), "cluster": True, "primaries": list(layout.primaries),
        "replicas": list(replicas), "batches": k, "mean_batch": round(n / k, 1),
        "chunks": len(chunks), "script_calls": {"put_pending": put, "write": write},
        "expected_eval": round(len(chunks) * (expected_groups(SUBMIT_CHUNK) + 1)
                               + k * (expected_groups(n / k) + 1), 1),
        "commands": rows, "other_commands": others(counts, rows),
        "per_primary": _per_primary(run, layout, names, predicted, per_node, idle_node),
        "bytes_per_request": {
            **{side: {"predicted": round(bytes_[side], 1),
                      "measured": round(run.net_per_request(side), 1)}
               for side in ("in", "out")},
            "replication_out": {"measured": round(run.net_per_request("repl_out"), 1)}},
        "round_trips_per_request": {"submit": round(submit_trips / n, 4),
                                    "worker": round(worker_trips / n, 4), "read": 0.0},
    }


def _per_primary(run: Measured, layout: Layout, names: Names,
                 predicted: dict[str, Counter[str]], per_node: dict[str, Counts],
                 idle_node: dict[str, Counts]) -> dict[str, dict[str, Any]]:
    """Each primary's tags and fixed keys, its counts, and its share of the requests."""
    tags: dict[str, set[int]] = {p: set() for p in layout.primaries}
    for res in run.results:
        tags[layout.node_of(names.result(res.request_id))].add(result_tag(res.request_id))
    n = len(run.results)
    out: dict[str, dict[str, Any]] = {}
    for p in layout.primaries:
        now, idle = per_node[p], idle_node[p]

        def net(key: str, now: Counts = now, idle: Counts = idle) -> float:
            return round((now[key] - idle[key] * run.scale) / n, 1)
        calls = sum(v for c, v in now.items() if c not in METERS)
        quiet = sum(v for c, v in idle.items() if c not in METERS) * run.scale
        holds = [stream.rpartition(":stream:")[2] for stream, node in layout.reads
                 if node == p]
        holds += ["control plane"] if layout.control == p else []
        holds += [f"client {i} channel" for i, node in enumerate(layout.channels) if node == p]
        out[p] = {
            "result_tags": sorted(tags[p]), "holds": holds,
            "records_share": round(predicted[p]["hsetnx"] / n, 3),
            "commands": {c: {"predicted": predicted[p][c], "measured": now.get(c, 0)}
                         for c in ORDER},
            "xreadgroup": now.get("xreadgroup", 0),
            "calls_per_request": round((calls - quiet) / n, 3),
            "net_in_per_request": net("net_in"), "net_out_per_request": net("net_out"),
            "repl_out_per_request": net("repl_out"),
            "cpu_us_per_request": round((now["cpu_us"] - idle["cpu_us"] * run.scale) / n, 2),
        }
    return out


def render(found: dict[str, Any]) -> str:
    """The cluster tables docs/scaling.md quotes."""
    n, k = found["requests"], found["batches"]
    lines = [f"Redis Cluster, {len(found['primaries'])} primaries and "
             f"{len(found['replicas'])} replicas: {n:,} requests ({found['succeeded']:,} "
             f"succeeded) from {found['clients']} client(s) in {k:,} batches (mean "
             f"{found['mean_batch']}), {found['chunks']} submit_many chunks of "
             f"{found['chunk']}, {found['elapsed_s']} s", "",
             "| command | predicted | measured (sum over primaries) | idle background "
             "| measured per request |", "|---|---:|---:|---:|---:|"]
    for name, row in found["commands"].items():
        pred = (f"{row['predicted']:,}" if "predicted" in row else
                f"{row['predicted_low']:,}..{row['predicted_high']:,}")
        lines.append(f"| {name} | {pred} | {row['measured']:,} | {row['background']:,} "
                     f"| {row['measured'] / n:.4f} |")
    calls = found["script_calls"]
    lines += ["", f"Script calls per slot group: put-pending {calls['put_pending']:,} "
              f"({calls['put_pending'] / found['chunks']:.2f} per chunk), write "
              f"{calls['write']:,} ({calls['write'] / k:.2f} per batch); the expected-tag "
              f"formula gives {found['expected_eval']:,} EVAL in all.", "",
              "| primary | result tags | also holds | records | EVAL predicted / measured "
              "| SPUBLISH | XADD | XREADGROUP | calls / request | CPU µs / request "
              "| bytes in / out / replication per request |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p, row in found["per_primary"].items():
        c = row["commands"]
        lines.append(
            f"| {p} | {len(row['result_tags'])} ({','.join(map(str, row['result_tags']))}) "
            f"| {', '.join(row['holds']) or '-'} | {row['records_share']:.1%} "
            f"| {c['eval']['predicted']:,} / {c['eval']['measured']:,} "
            f"| {c['spublish']['predicted']:,} / {c['spublish']['measured']:,} "
            f"| {c['xadd']['predicted']:,} / {c['xadd']['measured']:,} | {row['xreadgroup']:,} "
            f"| {row['calls_per_request']} | {row['cpu_us_per_request']} "
            f"| {row['net_in_per_request']} / "
            f"{row['net_out_per_request']} / {row['repl_out_per_request']} |")
    lines += ["", "| bytes per request | predicted | measured (background removed) |",
              "|---|---:|---:|"]
    b = found["bytes_per_request"]
    lines += [f"| {side} | {b[side]['predicted']:,} | {b[side]['measured']:,} |"
              for side in ("in", "out")]
    lines.append(f"| replication out (to the replicas, apart from the above) | - "
                 f"| {b['replication_out']['measured']:,} |")
    reads = found.get("reads")
    if reads:
        lines += ["", f"Read phase: {reads['gets']} get() calls, then a wait_many on "
                  f"{reads['foreign_waits']} IDs from a client that did not submit them.",
                  "", "| command | predicted | measured |", "|---|---:|---:|"]
        lines += [f"| {c} | {row['predicted']:,} | {row['measured']:,} |"
                  for c, row in reads["commands"].items()]
    others_ = ", ".join(f"{c} {v}" for c, v in sorted(found["other_commands"].items()))
    rt, mem = found["round_trips_per_request"], found["memory_bytes"]
    lines += ["", f"Other commands (background): {others_ or 'none'}", "",
              f"Redis CPU per request: {found['redis_cpu_us_per_request']} us, summed over "
              "the primaries (INFO cpu, idle background removed).",
              f"Round trips per request (one per node a pipeline reaches): submit "
              f"{rt['submit']}, worker {rt['worker']}, read {rt['read']}.",
              f"Memory: {mem['per_result_used_memory']} B per retained result (used_memory "
              f"over the primaries), {mem['per_result_memory_usage']} B (MEMORY USAGE of one "
              f"record), {mem['per_queued_request']} B per queued request.", ""]
    return "\n".join(lines)
