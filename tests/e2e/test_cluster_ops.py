"""Operations on a real Redis Cluster (3 primaries, 3 replicas): the HTTP gateway round
trip with tenancy, a bulk job, request cancel, lane purge, a rollout step and
``batchfleet status``.

Each is what the single-node suite proves for ``redis://`` (test_gateway*.py,
test_bulk.py, test_request_control.py, test_rollout_ops.py, test_status.py), cut to
what could break on a cluster: scripts and pipelines whose keys span slots, reads
of every shard stream of a lane, and announcements over sharded pub/sub. The CLI runs
as a child process, as an operator runs it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from batchfleet.connectors.cluster_plane import ClusterDeadLetterQueue
from batchfleet.connectors.dead_letters import DeadLetter
from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.rollout_stats import RedisRolloutStats, VersionDelta
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration, ModelVersion, TensorSpec
from batchfleet.workers.middleware.cancels import CancelledDrop
from tests.support.bulk_main import mlp_inputs, mlp_reference, read_jsonl, write_jsonl
from tests.support.cli import run_cli
from tests.support.gateway_main import live_gateway
from tests.support.models import Switchable, switchable
from tests.support.transports import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

X = [0.25] * 10
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _at(fleet: Fleet) -> tuple[str, ...]:
    return ("--broker", fleet.broker, "--namespace", fleet.namespace)


def _names(fleet: Fleet) -> Names:
    return Names(fleet.namespace, cluster=True)


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """A liveness bound only: the condition is what the test asserts."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_gateway_round_trip_and_tenancy_on_a_cluster(cluster_fleet: Fleet) -> None:
    """Submit one request and a batch over HTTP with no worker yet, then poll until a
    worker has answered them. Another key gets for them exactly what it gets for an ID
    that does not exist; a key's in-flight limit (the admission script, and the cluster's
    separate ``ZREM`` after the terminal write) is held, then freed by completion."""
    keys = KeyRing.parse(f"bill:{hash_key('k-bill')}:*\neve:{hash_key('k-eve')}:*\n"
                         f"fl:{hash_key('k-fl')}:demo-mlp:in_flight=2")
    bill, eve, fl = ({"X-API-Key": k} for k in ("k-bill", "k-eve", "k-fl"))
    settings = GatewaySettings(broker=cluster_fleet.broker, namespace=cluster_fleet.namespace,
                               keys=keys, id_secret="test-secret-0123456789abcdef")
    registry = open_model_registry(cluster_fleet.broker, Names(cluster_fleet.namespace))
    try:  # declared ahead of workers: submits are accepted with no worker running
        await registry.declare("demo-mlp", Declaration(0.0))
    finally:
        await registry.close()
    x = np.linspace(0, 1, 10, dtype=np.float32)
    url = "/v1/models/demo-mlp/requests"
    with live_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            one = await http.post(url, json={"inputs": x.tolist()}, headers=bill)
            assert one.status_code == 202, one.text
            many = await http.post("/v1/models/demo-mlp/batches",
                                   json={"inputs": [x.tolist()] * 3}, headers=bill)
            assert many.status_code == 202, many.text
            held = [await http.post(url, json={"inputs": X}, headers=fl) for _ in range(3)]
            assert [r.status_code for r in held] == [202, 202, 429]
            ids = [one.json()["request_id"], *many.json()["request_ids"],
                   *(r.json()["request_id"] for r in held[:2])]
            done: dict[str, Any] = {}

            async def polled() -> bool:  # plain polls, no long poll
                for rid, auth in zip(ids, [bill] * 4 + [fl] * 2, strict=True):
                    if rid not in done:
                        body = (await http.get(f"/v1/requests/{rid}", headers=auth)).json()
                        if body["status"] != "pending":
                            done[rid] = body
                return len(done) == len(ids)
            async with cluster_fleet.worker(webhooks=False) as worker:
                await _until(polled, 30)
            freed = await http.post(url, json={"inputs": X}, headers=fl)
            stolen = await http.get(f"/v1/requests/{ids[0]}", headers=eve)
            made_up = await http.get("/v1/requests/gw-" + "0" * 40, headers=eve)
            multi = await http.get("/v1/requests", params={"ids": ",".join(ids[:4])},
                                   headers=eve)
            own = await http.get("/v1/requests", params={"ids": ",".join(ids[:4])},
                                 headers=bill)
    assert {d["status"] for d in done.values()} == {"succeeded"}
    reference = mlp_reference(x[None])[0]
    for rid in ids[:4]:
        np.testing.assert_allclose(done[rid]["outputs"], reference, **TOL)
    assert worker.stats.succeeded == 6
    assert freed.status_code == 202, freed.text  # completion freed fl's in-flight slots
    assert stolen.status_code == made_up.status_code == 404
    assert stolen.text.replace(ids[0], "ID") == made_up.text.replace("gw-" + "0" * 40, "ID")
    assert multi.json() == {"results": [], "not_found": ids[:4]}
    assert [r["request_id"] for r in own.json()["results"]] == ids[:4]
    redis = redis_client(cluster_fleet.broker)
    try:  # the records sit under their cluster hash tags, owned by the submitting key
        record = await redis.hmget(_names(cluster_fleet).result(ids[0]), ["status", "owner"])
        assert record == [b"succeeded", b"bill"]
    finally:
        await redis.aclose()


async def test_bulk_run_and_status_on_a_cluster(cluster_fleet: Fleet, tmp_path: Path) -> None:
    n, job = 300, "cluster-bulk-1"
    x = mlp_inputs(n, seed=17)
    write_jsonl(tmp_path / "in.jsonl", x)
    out_path = tmp_path / "out.jsonl"
    async with cluster_fleet.worker(webhooks=False, max_batch_size=64):
        code, out, err = await run_cli("bulk", "run", "-m", "demo-mlp",
                                    "-i", str(tmp_path / "in.jsonl"), "--out", str(out_path),
                                    "--job-id", job, *_at(cluster_fleet), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["status"], report["rows"], report["failed"]) == ("finished", n, 0)
    rows = read_jsonl(out_path)
    assert [r["custom_id"] for r in rows] == [f"c{i}" for i in range(n)]
    np.testing.assert_allclose(np.array([r["outputs"] for r in rows], np.float32),
                               mlp_reference(x), **TOL)
    code, out, err = await run_cli("bulk", "status", job, *_at(cluster_fleet), "--json")
    assert code == 0, err
    status = json.loads(out)
    assert (status["job_id"], status["status"], status["rows_done"], status["failed"]) == (
        job, "finished", n, 0)
    code, out, err = await run_cli("bulk", "list", *_at(cluster_fleet), "--json")
    assert code == 0, err
    assert [j["job_id"] for j in json.loads(out)] == [job]


async def test_cancel_on_a_cluster_drops_requests_unrun(cluster_fleet: Fleet) -> None:
    names = _names(cluster_fleet)
    async with cluster_fleet.client(check_model=False) as client:
        keep = await client.submit("demo-mlp", X)
        gone, by_cli = await client.submit_many("demo-mlp", [X, X])
        waiting = asyncio.create_task(client.wait(gone, timeout=30))
        report = await client.cancel(gone)
        assert (report.outcome, report.status) == ("cancelled", "cancelled")
        # announced over sharded pub/sub: the waiter ends at once
        assert (await asyncio.wait_for(waiting, 5)).status == "cancelled"
        code, out, _ = await run_cli("cancel", by_cli, "nope-1", *_at(cluster_fleet))
        assert code == 4 and f"{by_cli}: cancelled" in out and "nope-1: unknown" in out
        assert (await client.cancel(by_cli)).outcome == "already_finished"
        async with cluster_fleet.worker(webhooks=False) as worker:
            assert (await client.wait(keep, timeout=30)).status == "succeeded"
            drop = worker.find(CancelledDrop)

            async def dropped() -> bool:
                return drop.dropped == 2
            await _until(dropped)
            assert worker.stats.computed == 1  # only ``keep``
        results = [await client.get(rid) for rid in (gone, by_cli)]
    assert [(r.status, r.error.type if r.error else None) for r in results if r] == [
        ("cancelled", "cancelled")] * 2
    redis = redis_client(cluster_fleet.broker)
    try:  # the lane is empty, and so is the cancel set: workers stop looking at it
        assert await redis.xlen(names.stream("demo-mlp", "interactive")) == 0
        assert await redis.zcard(names.cancelled) == 0
    finally:
        await redis.aclose()


async def test_lane_purge_over_shards_on_several_primaries(cluster_fleet: Fleet) -> None:
    """A lane split four ways (its shard streams on different slots): the purge cancels
    every queued request on every shard, waiters end at once, other lanes keep theirs."""
    names, ns = _names(cluster_fleet), cluster_fleet.namespace
    registry = open_model_registry(cluster_fleet.broker, Names(ns))
    spec = TensorSpec("float32", (10,))
    try:  # a worker's registration, without a worker: the lane has four shards
        await registry.serve("w-gone", {"demo-mlp": [ModelVersion("default", "sha256:d",
                                                                 spec, spec)]},
                             lane_shards={"demo-mlp": 4})
    finally:
        await registry.close()
    shards = names.shard_streams("demo-mlp", "bulk", 4)
    redis = redis_client(cluster_fleet.broker)
    try:
        async with cluster_fleet.client() as client:  # reads the shard count
            ids = await client.submit_many("demo-mlp", [X] * 400, priority="bulk")
            fast = await client.submit("demo-mlp", X)  # interactive: not purged
            lengths = [await redis.xlen(s) for s in shards]
            assert sum(lengths) == 400 and all(lengths)
            waiting = asyncio.create_task(client.wait_many(ids, timeout=60))
            await redis.xadd(shards[2], {b"p": b"\xc1 not msgpack"})
            code, out, err = await run_cli("lane", "purge", "demo-mlp", "--lane", "bulk",
                                        "--yes", "--json", *_at(cluster_fleet))
            assert code == 0, err
            (purged,) = [json.loads(line) for line in out.splitlines()]
            assert (purged["cancelled"], purged["undecodable"]) == (400, 1)
            done = await asyncio.wait_for(waiting, 10)  # announced: the waiters end
            assert {r.status for r in done} == {"cancelled"}
            assert [await redis.xlen(s) for s in shards] == [0] * 4
            assert await redis.xlen(names.undecodable_stream) == 1
            assert (await client.get(fast)).status == "pending"  # type: ignore[union-attr]
    finally:
        await redis.aclose()


async def test_rollout_canary_promote_and_rollback_on_a_cluster(cluster_fleet: Fleet) -> None:
    ns, f10, f1 = cluster_fleet.namespace, TensorSpec("float32", (10,)), TensorSpec("float32",
                                                                                 (1,))
    registry = open_model_registry(cluster_fleet.broker, Names(ns))
    try:
        await registry.serve("w-test", {"demo-mlp": [
            ModelVersion(label, f"sha256:{label}", f10, f1) for label in ("default", "v2")]})
    finally:
        await registry.close()

    async def rollout(*args: str) -> Any:
        code, out, err = await run_cli("rollout", *args, *_at(cluster_fleet), "--json")
        assert code == 0, err
        return json.loads(out)

    policy = await rollout("set", "demo-mlp", "--stable", "default", "--canary", "v2",
                           "--percent", "20", "--who", "alice", "--why", "try v2")
    assert (policy["stable"], policy["canary"], policy["percent"], policy["epoch"]) == (
        "default", "v2", 20.0, 1)
    # what workers publish per version and role: 90 stable, 10 canary (1 error)
    stable, canary = VersionDelta(), VersionDelta()
    stable.add_batch(90, 0, 2.0)
    canary.add_batch(10, 1, 3.0)
    redis = redis_client(cluster_fleet.broker)
    try:
        await RedisRolloutStats(redis, _names(cluster_fleet)).flush_versions(
            "demo-mlp", 1, {("default", "stable"): stable, ("v2", "canary"): canary})
    finally:
        await redis.aclose()
    status = await rollout("status", "demo-mlp")
    assert status["policy"] == policy and status["stats_available"] is True
    roles = {label: v["role"] for label, v in status["versions"].items()}
    assert roles == {"default": "stable", "v2": "canary"}
    seen = status["versions"]["v2"]["stats"]["roles"]["canary"]
    assert (seen["requests"], seen["errors"]) == (10, 1)
    promoted = await rollout("promote", "demo-mlp", "--why", "v2 is fine")
    assert (promoted["stable"], promoted["canary"], promoted["previous"],
            promoted["epoch"]) == ("v2", None, "default", 2)
    back = await rollout("rollback", "demo-mlp", "--why", "v2 bad")
    assert (back["stable"], back["previous"], back["epoch"]) == ("default", None, 3)
    history = (await rollout("status", "demo-mlp"))["history"]
    assert [h["action"] for h in history] == ["rollback", "promote", "set"]


async def test_status_on_a_cluster_with_a_worker_and_without(cluster_fleet: Fleet) -> None:
    model = Switchable()
    async with cluster_fleet.worker(handlers={"switch": switchable(model)}, webhooks=False,
                                    sample_every_s=0.2, max_attempts=1) as worker, \
            cluster_fleet.client() as client:
        ok = await client.wait_many(await client.submit_many(
            "switch", np.random.default_rng(8).random((100, 10), dtype=np.float32)),
            timeout=30)
        assert {r.status for r in ok} == {"succeeded"}
        model.broken = True
        assert (await client.wait(await client.submit("switch", X), timeout=30)
                ).status == "failed"
        snap: dict[str, Any] = {}

        async def counted() -> bool:  # the next heartbeat carries the counters
            code, out, err = await run_cli("status", *_at(cluster_fleet), "--json")
            assert code == 0, err
            snap.update(json.loads(out))
            workers = snap["workers"]
            return bool(workers) and workers[0]["counters"]["dead_lettered"] == 1
        await _until(counted, 30)
    (only,) = snap["workers"]
    assert only["worker_id"] == worker.settings.worker_id and only["models"] == ["switch"]
    assert only["counters"]["succeeded"] == 100
    lane = next(x for x in snap["lanes"] if (x["model"], x["lane"]) == ("switch",
                                                                       "interactive"))
    assert (lane["depth"], lane["dlq"], lane["workers"]) == (0, 1, 1)
    assert snap["totals"]["dlq"] == 1
    # the worker is gone (its heartbeat with it); requests wait on the lane
    async with cluster_fleet.client() as client:
        await client.submit_many("switch", np.zeros((7, 10), np.float32))
    code, out, err = await run_cli("status", *_at(cluster_fleet), "--json")
    assert code == 0, err
    after = json.loads(out)
    lane = next(x for x in after["lanes"] if (x["model"], x["lane"]) == ("switch",
                                                                        "interactive"))
    assert after["workers"] == [] and (lane["depth"], lane["lag"], lane["workers"]) == (7, 7, 0)


async def test_dlq_purge_on_a_cluster_counts_and_drops_the_stream(cluster_fleet: Fleet) -> None:
    """`dlq purge` on a cluster: a cluster pipeline queued UNLINK apart from its MULTI, so
    the purge failed to unpack; it is one script on one key now."""
    names = _names(cluster_fleet)
    redis = redis_client(cluster_fleet.broker)
    try:
        dlq = ClusterDeadLetterQueue(redis, names)
        await dlq.add([DeadLetter(f"p-{n}", "demo-mlp", b"", 3, [], "retries exhausted")
                       for n in range(5)])
        assert await dlq.size("demo-mlp") == 5
        assert await dlq.purge("demo-mlp") == 5
        assert await dlq.size("demo-mlp") == 0
    finally:
        await redis.aclose()
