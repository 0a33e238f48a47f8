"""``bench --capacity``'s run: a real worker and the SDK, counted by Redis itself.

The run resets the counters on every node (``CONFIG RESETSTAT``), submits N requests
with ``submit_many`` to a real worker process, waits for every result and for every
ack, then reads the counters (``capacity_meter``). An idle window of the same fleet,
read the same way first, is the background (heartbeats, policy reads, idle fetches)
that the request paths are measured on top of. A read phase and a queued-request
phase follow. The same run serves one Redis (``capacity``'s model) and a Redis Cluster
(``capacity_cluster``'s). On a cluster it is started here (``--cluster``) or given as
a ``redis+cluster://`` URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from batchfleet.bench import capacity, capacity_cluster
from batchfleet.bench.capacity import (
    READ_CHUNK,
    WAIT_TIMEOUT_S,
    CapacityPlan,
    Measured,
    others,
    report,
    sizes_for,
)
from batchfleet.bench.capacity_meter import Meter, open_meter, summed
from batchfleet.bench.cluster_servers import ClusterServers
from batchfleet.bench.fleet import new_namespace, services, worker
from batchfleet.connectors.redis_client import is_cluster_url
from batchfleet.demo import demo_inputs
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.names import LANE_INTERACTIVE, Names


async def measure_capacity(plan: CapacityPlan) -> dict[str, Any]:
    """Run the fleet, count, and return measured and predicted costs (JSON-ready)."""
    with _redis_url(plan) as url:
        cluster = url is not None and is_cluster_url(url)
        # RQ (webhooks) has no Cluster support: the worker refuses to start with it.
        extra = ("--no-webhooks",) if cluster else ()
        ns = new_namespace("capacity")
        with services(url, None, False) as svc, worker(
                svc, "redis", plan.model, plan.max_batch_size, plan.max_wait_ms, ns, extra):
            meter = await open_meter(svc.redis_url)
            try:
                return await _measure(plan, meter, Names(ns, cluster=cluster))
            finally:
                await meter.close()


@contextmanager
def _redis_url(plan: CapacityPlan) -> Iterator[str | None]:
    """The given URL; with ``cluster`` and none given, a throwaway cluster's; else None
    (``services`` starts an embedded Redis)."""
    if plan.cluster and plan.redis_url is None:
        with ClusterServers() as servers:
            yield servers.url
    else:
        yield plan.redis_url


async def _measure(plan: CapacityPlan, meter: Meter, names: Names) -> dict[str, Any]:
    url = meter.url
    clients = [AsyncClient(url, namespace=names.prefix, poll_interval_s=plan.poll_interval_s)
               for _ in range(plan.clients)]
    try:
        warm = [await c.submit_many(plan.model, list(demo_inputs(plan.model, 8)))
                for c in clients]
        sample = (await clients[0].wait_many(warm[0], WAIT_TIMEOUT_S))[0]
        for c, ids in zip(clients[1:], warm[1:], strict=True):
            await c.wait_many(ids, WAIT_TIMEOUT_S)
        await meter.reset()
        await asyncio.sleep(plan.idle_s)
        idle = await meter.read()
        inputs = list(demo_inputs(plan.model, plan.requests))
        mem_before = await meter.used_memory()
        await meter.reset()
        start = time.perf_counter()
        per_client = await asyncio.gather(*(
            _submit_and_wait(c, plan.model, inputs[i::plan.clients])
            for i, c in enumerate(clients)))
        await _until_acked(meter, names.stream(plan.model, LANE_INTERACTIVE))
        elapsed = time.perf_counter() - start
        counts = await meter.read()
        mem_after = await meter.used_memory()
        ids = [res.request_id for done in per_client for res in done]
        sizes = sizes_for(names, plan.model, clients[0].client_id, sample, ids)
        gets, foreign = min(plan.gets, len(ids)), min(plan.foreign_waits, len(ids))
        layout = (await capacity_cluster.layout_for(meter, names, plan.model,
                                                    [c.client_id for c in clients])
                  if meter.cluster else None)
        predicted_reads = (
            capacity.predict_reads(gets, foreign) if layout is None else
            capacity_cluster.predict_reads(gets, [names.result(i) for i in ids[-foreign:]],
                                           layout))
        reads = await _read_phase(meter, names, clients[0], ids, gets, foreign,
                                  predicted_reads)
        stored = await meter.memory_usage(names.result(ids[-1]))
        queued = await _queued_bytes(meter, names, plan.model, plan.queued) \
            if plan.queued else None
    finally:
        for c in clients:
            await c.close()
    primaries = meter.primaries
    run = Measured(plan, [list(done) for done in per_client], summed(counts, primaries),
                   summed(idle, primaries), elapsed, sizes,
                   {"per_result_used_memory": (mem_after - mem_before) / plan.requests,
                    "per_result_memory_usage": stored, "per_queued_request": queued})
    found = (report(run) if layout is None else
             capacity_cluster.cluster_report(run, layout, names, counts, idle, meter.replicas))
    found["reads"] = reads
    return found


async def _until_acked(meter: Meter, stream: str) -> None:
    """A result is announced before its entry is acked (write first, then ack): wait for
    the last acks, so every batch's are counted. XINFO is no command of the model."""
    for _ in range(int(WAIT_TIMEOUT_S / 0.01)):
        if await meter.pending_entries(stream) == 0:
            return
        await asyncio.sleep(0.01)


async def _submit_and_wait(client: AsyncClient, model: str, inputs: list[Any]) -> list[Result]:
    return await client.wait_many(await client.submit_many(model, inputs), WAIT_TIMEOUT_S)


async def _read_phase(meter: Meter, names: Names, client: AsyncClient, ids: list[str],
                      gets: int, foreign: int, predicted: dict[str, int]) -> dict[str, Any]:
    """``get`` on some results, then a second client's ``wait_many`` on others, counted."""
    async with AsyncClient(meter.url, namespace=names.prefix) as other:
        await other.known_models()  # its connections open outside the counted window
        await meter.reset()
        for rid in ids[:gets]:
            await client.get(rid)
        await other.wait_many(ids[-foreign:], WAIT_TIMEOUT_S)
        counts = summed(await meter.read(), meter.primaries)
    return {"gets": gets, "foreign_waits": foreign, "read_chunk": READ_CHUNK,
            "commands": {c: {"predicted": v, "measured": counts.get(c, 0)}
                         for c, v in predicted.items()},
            "other_commands": others(counts, predicted),
            "bytes_out_per_read": round(counts["net_out"] / (gets + foreign), 1)}


async def _queued_bytes(meter: Meter, names: Names, model: str, n: int) -> float:
    """Memory per queued request: N submitted where no worker reads (pending record +
    stream entry), then deleted."""
    queued = Names(new_namespace("capacity-q"), cluster=names.cluster)
    before = await meter.used_memory()
    async with AsyncClient(meter.url, namespace=queued.prefix, check_model=False) as client:
        # A cluster client whose first call is the subscription fails (SlotNotCoveredError:
        # its slot map is read on the first command), so read something first.
        await client.known_models()
        ids = await client.submit_many(model, list(demo_inputs(model, n, seed=3)))
        grown = (await meter.used_memory() - before) / n
    await meter.unlink([queued.stream(model, LANE_INTERACTIVE),
                        *(queued.result(i) for i in ids)])
    return grown


def run_capacity(plan: CapacityPlan) -> dict[str, Any]:
    return asyncio.run(measure_capacity(plan))


def render(found: dict[str, Any]) -> str:
    """The tables docs/scaling.md quotes, for one Redis or a cluster."""
    if found.get("cluster"):
        return capacity_cluster.render(found)
    return capacity.render(found)
