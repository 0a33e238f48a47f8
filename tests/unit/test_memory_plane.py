"""``memory://``'s own rules: one store per URL name shared by every opener, wake-ups
across event loops (the blocking client's thread), and the seams that only exist on
Redis's side as separate classes (routes, rollouts, quotas, bulk jobs, cancels, fleet)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from batchfleet.connectors import TerminalWrite, open_control_plane
from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.memory_broker import open_memory_broker
from batchfleet.connectors.memory_plane import MemoryControlPlane, open_memory_control_plane
from batchfleet.connectors.memory_state import memory_name, reset_memory
from batchfleet.connectors.quotas import Quota
from batchfleet.connectors.registry import BROKERS_GROUP, BUILT_IN, PLANES_GROUP
from batchfleet.connectors.rollout_stats import VersionDelta
from batchfleet.connectors.values import CacheEntry, Ownership
from batchfleet.schemas.envelopes import (
    NOTIFY_RESULTS,
    Request,
    Result,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import LANE_BULK, LANE_INTERACTIVE, Names
from batchfleet.schemas.registry import ModelVersion

pytestmark = pytest.mark.unit
NAMES = Names("mp")


@pytest.fixture
def url() -> Iterator[str]:
    found = f"memory://unit-{uuid.uuid4().hex[:8]}"
    yield found
    reset_memory(found)


def plane_of(url: str) -> MemoryControlPlane:
    return open_memory_control_plane(url, NAMES)


def test_urls_name_stores() -> None:
    assert memory_name("memory://") == "default"
    assert memory_name("memory://nb") == "nb"
    assert memory_name("MEMORY://a/b/") == "a/b"
    with pytest.raises(ConfigError):
        memory_name("redis://x")
    assert "memory" in BUILT_IN[PLANES_GROUP] and "memory" in BUILT_IN[BROKERS_GROUP]


async def test_openers_of_one_url_share_a_store_and_namespaces_do_not(url: str) -> None:
    one = open_control_plane(url, namespace=NAMES.prefix)
    await one.results.put_pending([("a", b"p")])
    assert await plane_of(url).results.get_bodies(["a"]) == [b"p"]
    assert await open_memory_control_plane(url, Names("other")).results.missing(["a"]) == ["a"]
    assert await plane_of(url + "x").results.missing(["a"]) == ["a"]


def test_an_announcement_crosses_event_loops(url: str) -> None:
    """A waiter on one thread's loop (the blocking Client's) is woken by a write on
    another loop (the worker's), without polling."""
    got: list[object] = []
    subscribed = threading.Event()

    def waiter() -> None:
        async def wait() -> None:
            sub = await plane_of(url).announcements.subscribe("c1")
            subscribed.set()
            got.extend(await sub.next(5.0))
            await sub.close()
        asyncio.run(wait())

    thread = threading.Thread(target=waiter)
    thread.start()
    assert subscribed.wait(5)
    started = time.monotonic()

    async def write() -> None:
        plane = plane_of(url)
        await plane.results.put_pending([("r", b"p")])
        await plane.results.write_terminal([TerminalWrite("r", "succeeded", b"body", "c1",
                                                          notify_format=NOTIFY_RESULTS)])
    asyncio.run(write())
    thread.join(5)
    assert got == [("r", b"body")] and time.monotonic() - started < 2


async def test_a_blocked_fetch_wakes_on_publish(url: str) -> None:
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w")
    await consumer.start(["m"])
    fetching = asyncio.create_task(consumer.fetch(10, 5.0))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await broker.publisher().publish([OutboundMessage("m", LANE_BULK, "b", b"b"),
                                      OutboundMessage("m", LANE_INTERACTIVE, "i", b"i")])
    got = await fetching
    assert time.monotonic() - started < 1
    assert [d.payload for d in got] == [b"i", b"b"]  # interactive first


async def test_quotas_charge_and_a_won_write_frees_the_slot(url: str) -> None:
    plane = plane_of(url)
    quota = Quota(rate_per_s=0, max_in_flight=2)
    assert (await plane.quotas.admit("k", quota, ["a", "b"])).allowed
    refused = await plane.quotas.admit("k", quota, ["c"])
    assert (refused.code, refused.in_flight) == (-1, 2)
    await plane.results.put_pending([("a", b"p")], [Ownership("k")])
    await plane.results.write_terminal([TerminalWrite("a", "succeeded", b"s")])
    assert (await plane.quotas.admit("k", quota, ["c"])).allowed
    await plane.quotas.release("k", ["b", "c"])
    rate = Quota(rate_per_s=1, burst=2)
    assert (await plane.quotas.admit("r", rate, ["1", "2"])).allowed
    over = await plane.quotas.admit("r", rate, ["3"])
    assert over.code == 0 and 0 < over.retry_after_s <= 1
    assert (await plane.quotas.admit("r", rate, ["1", "2", "3"])).code == -2


async def test_bulk_job_leases_are_fenced(url: str) -> None:
    jobs = plane_of(url).bulk_jobs
    await jobs.create("j1", {"state": "running", "cancel": 0}, 1.0)
    await jobs.create("j2", {"state": "queued"}, 2.0)
    assert await jobs.take_lease("j1", "t1", 60) is None
    assert await jobs.take_lease("j1", "t2", 60) == "t1"
    assert await jobs.fenced_write("j1", "t2", {"done": 3}, 60, 600) == -1
    assert await jobs.fenced_write("j1", "t1", {"done": 3}, 60, 600) == 0
    await jobs.write("j1", {"cancel": 1})
    assert await jobs.fenced_write("j1", "t1", {}, 60, 600) == 1
    assert await jobs.steal_lease("j1", "t1", "t3", 60)
    assert not await jobs.steal_lease("j1", "t1", "t4", 60)
    assert await jobs.read("j1") == ({"state": "running", "cancel": "1", "done": "3"}, "t3")
    await jobs.release_lease("j1", "t3")
    assert (await jobs.read("j1"))[1] is None
    assert await jobs.recent(10) == ["j2", "j1"]
    await jobs.index_shard("j1", "s2", 2.0, 60)
    await jobs.index_shard("j1", "s1", 1.0, 60)
    assert await jobs.shards_of("j1") == ["s1", "s2"]
    await jobs.unindex(["j2"])
    assert await jobs.recent(10) == ["j1"]


async def test_cancel_answers_queued_requests_and_leaves_held_ones(url: str) -> None:
    plane = plane_of(url)
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w")
    await consumer.start(["m"])
    for rid in ("held", "queued"):
        req = Request(rid, "m", np.zeros(2, np.float32), notify="c1")
        await plane.results.put_pending([(rid, encode_result(Result(rid, "pending", model="m")))],
                                        [Ownership(notify="c1")])
        await broker.publisher().publish([OutboundMessage("m", LANE_INTERACTIVE, rid,
                                                          encode_request(req))])
    [held] = await consumer.fetch(1, 1.0)
    reports = await plane.cancels.cancel(["held", "queued", "nope"])
    assert [r.outcome for r in reports] == ["already_running", "cancelled", "unknown"]
    [body] = await plane.results.get_bodies(["queued"])
    assert body is not None and decode_result(body).status == "cancelled"
    assert await plane.cancels.size() == 1
    assert await plane.cancels.take(["held", "queued"]) == {"queued"}
    assert await plane.cancels.size() == 0
    report = await plane.cancels.purge_lane("m", LANE_INTERACTIVE)
    assert (report.cancelled, report.dropped, report.held) == ([], 1, 1)
    assert await plane.cancels.lane_depths("m", [LANE_INTERACTIVE]) == {LANE_INTERACTIVE: 1}
    await consumer.ack([held])


async def test_routes_settle_once_and_rollouts_read_stats(url: str) -> None:
    plane = plane_of(url)
    await plane.models.serve("w1", {"m": [ModelVersion("v1", "sha:1"),
                                          ModelVersion("v2", "sha:2")]})
    [table] = (await plane.routes.tables(["m", "unknown"])).values()
    assert table.held == {"v1", "v2"} and table.policy.stable == "v1"
    assert await plane.routes.settle("m", {"r1": "v2"}) == {"r1": "v2"}
    assert await plane.routes.settle("m", {"r1": "v1", "r2": "v1"}) == {"r1": "v2", "r2": "v1"}
    await plane.rollouts.set("m", stable="v1", canary="v2", percent=50, who="t")
    delta = VersionDelta()
    delta.add_batch(4, 1, 2.0)
    await plane.rollout_stats.flush_versions("m", 1, {("v2", "canary"): delta})
    await plane.rollout_stats.flush_versions("m", 0, {("v2", "canary"): delta})  # older: dropped
    status = await plane.rollouts.status("m")
    assert status.stats is not None
    canary = status.stats["v2"].role("canary")
    assert (canary.requests, canary.errors) == (4, 1)
    assert await plane.rollout_stats.claim_guard("m", 1, "a")
    assert not await plane.rollout_stats.claim_guard("m", 1, "b")
    rolled = await plane.rollouts.rollback("m", who="t")
    assert rolled.canary is None and rolled.epoch == 2


async def test_fleet_snapshot_joins_heartbeats_lanes_and_letters(url: str) -> None:
    plane = plane_of(url)
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w1")
    await consumer.start(["m"])
    await broker.publisher().publish([OutboundMessage("m", LANE_BULK, str(i), b"x")
                                      for i in range(3)])
    await consumer.fetch(1, 1.0)
    await plane.heartbeats.write("w1", {"worker_id": "w1", "models": ["m"]}, 10)
    await plane.models.serve("w1", {"m": [ModelVersion("default", "sha:1")]})
    snap = await plane.fleet(broker).read()
    [bulk] = [lane for lane in snap.lanes if lane.lane == LANE_BULK]
    assert (bulk.depth, bulk.pending, bulk.lag, bulk.workers) == (3, 1, 2, 1)
    assert [w.worker_id for w in snap.workers] == ["w1"]


async def test_records_and_cache_entries_expire(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES, result_ttl_s=1)
    plane.results.ttl_s = 0.05  # type: ignore[assignment]  # sub-second, to keep the test fast
    await plane.results.put_pending([("a", b"p")])
    entry = CacheEntry("v", np.zeros(1, np.float32))
    await plane.result_cache.put_many([("d", entry)], 1)
    assert await plane.results.missing(["a"]) == []
    await asyncio.sleep(0.1)
    assert await plane.results.missing(["a"]) == ["a"]
    [hit] = await plane.result_cache.get_many(["d"])
    assert hit is not None and hit.model_version == "v"


async def test_expired_records_are_swept_without_being_read(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES)
    plane.results.ttl_s = 0.01  # type: ignore[assignment]
    await plane.results.put_pending([(f"r{i}", b"p") for i in range(100)])
    await asyncio.sleep(0.02)
    plane.state._next_sweep = 0.0  # the sweep is due
    await plane.results.put_pending([("last", b"p")])
    assert set(plane.state.records) == {"last"}
