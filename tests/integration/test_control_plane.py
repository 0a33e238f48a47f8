"""The control plane's seams over a real Redis: the factory, heartbeats, announcements,
error wrapping, and a fleet reader whose cost does not grow with the keyspace."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from batchfleet.connectors import (
    BrokerURL,
    ControlPlane,
    TerminalWrite,
    control_plane_schemes,
    open_control_plane,
)
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.fleet import FleetReader
from batchfleet.schemas.envelopes import NOTIFY_RESULTS as R
from batchfleet.schemas.errors import ConfigError, ResultStoreError
from batchfleet.schemas.names import LANES, Names
from tests.support.seams import control_plane_for, open_result_store

pytestmark = pytest.mark.integration
NAMES = Names("cp")


async def test_factory_picks_the_store_by_scheme(redis_url: str) -> None:
    plane: ControlPlane = open_control_plane(redis_url, namespace=NAMES.prefix,
                                             result_ttl_s=60)
    try:
        assert await plane.results.ping()
        assert plane.results.ttl_s == 60
        assert {"redis", "rediss", "unix", "redis+cluster"} <= set(control_plane_schemes())
    finally:
        await plane.close()
    with pytest.raises(ConfigError, match="no control plane for scheme 'postgres'; installed: "):
        open_control_plane("postgres://db/x", namespace=NAMES.prefix)


async def test_heartbeats_are_found_without_a_scan_and_forgotten(redis_url: str) -> None:
    plane = open_control_plane(redis_url, namespace=NAMES.prefix)
    try:
        beats = plane.heartbeats
        assert await beats.write("w1", {"worker_id": "w1", "models": ["m"]}, 10) is False
        assert await beats.write("w1", {"worker_id": "w1", "models": ["m"]}, 10) is True
        await beats.write("w2", {"worker_id": "w2"}, 10)
        assert sorted(r.worker_id for r in await beats.read_all()) == ["w1", "w2"]
        await beats.forget("w1")
        assert [r.worker_id for r in await beats.read_all()] == ["w2"]
    finally:
        await plane.close()


async def test_announcements_reach_the_subscriber(redis_url: str) -> None:
    """Both formats (docs/wire-format.md §8): bodies for requests that asked, IDs alone
    (body None: read it back) for the rest."""
    store = open_result_store(redis_url, NAMES)
    plane = control_plane_for(store)
    subscription = await plane.announcements.subscribe("me")
    try:
        await store.put_pending([("a", b"p"), ("b", b"p"), ("c", b"p"), ("d", b"p")])
        await store.write_terminal([TerminalWrite("a", "succeeded", b"x", "me", notify_format=R),
                                    TerminalWrite("b", "succeeded", b"y", "me", notify_format=R),
                                    TerminalWrite("c", "succeeded", b"z", "me"),
                                    TerminalWrite("d", "failed", b"w", "me")])
        got: set[tuple[str, bytes | None]] = set()
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            got.update(await subscription.next(0.5))
        assert got == {("a", b"x"), ("b", b"y"), ("c", None), ("d", None)}
    finally:
        await subscription.close()
        await plane.close()


async def test_driver_errors_come_out_as_project_errors() -> None:
    """A store that is not there: every seam raises ResultStoreError, never RedisError."""
    plane = open_control_plane("redis://127.0.0.1:1/0", namespace=NAMES.prefix)
    try:
        for call in (plane.retry_schedule.size(), plane.retry_schedule.next_due(),
                     plane.dead_letters.size("m"), plane.undecodable.size(),
                     plane.heartbeats.read_all(), plane.results.lane_losses()):
            with pytest.raises(ResultStoreError):
                await call
        with pytest.raises(ResultStoreError, match="doing it"), \
                wrap_errors(ResultStoreError, "doing it"):
            raise ConnectionError("refused")
    finally:
        await plane.close()


async def _populate(client: aioredis.Redis, start: int, stop: int) -> None:
    for lo in range(start, stop, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(lo, min(stop, lo + 10_000)):
            pipe.hset(NAMES.result(f"r{i}"), mapping={"status": "succeeded", "body": b"x"})
        await pipe.execute()


async def _commands_of_one_read(client: aioredis.Redis, redis_url: str) -> dict[str, int]:
    reader = FleetReader(BrokerURL.parse(redis_url), redis_url, NAMES)
    try:
        await client.config_resetstat()
        snap = await reader.read()
        stats = await client.info("commandstats")
    finally:
        await reader.close()
    assert [w.worker_id for w in snap.workers] == ["w1"]
    assert {lane.model for lane in snap.lanes} == {"m1"}
    assert snap.lanes[0].dlq == 1
    ignored = ("cmdstat_info", "cmdstat_config|resetstat")
    return {k: int(v["calls"]) for k, v in stats.items() if k not in ignored}


async def test_status_costs_the_same_at_100k_result_keys(redis_url: str) -> None:
    """Issue 18: ``status`` finds workers, lanes and DLQs through sets, never a SCAN."""
    client = aioredis.Redis.from_url(redis_url)
    plane = open_control_plane(redis_url, namespace=NAMES.prefix)
    try:
        await client.sadd(NAMES.model_registry, "m1")
        for lane in LANES:
            await client.xadd(NAMES.stream("m1", lane), {"x": "1"})
        await client.sadd(NAMES.dead_letter_stream("_models"), "m1")
        await client.xadd(NAMES.dead_letter_stream("m1"), {"id": "r0"})
        await plane.heartbeats.write("w1", {"worker_id": "w1", "models": ["m1"]}, 10)
        await _populate(client, 0, 10)
        small = await _commands_of_one_read(client, redis_url)
        await _populate(client, 10, 100_000)
        assert await client.dbsize() > 100_000
        large = await _commands_of_one_read(client, redis_url)
        assert large == small
        assert not any(k in large for k in ("cmdstat_scan", "cmdstat_keys"))
        assert sum(small.values()) < 30
    finally:
        await plane.close()
        await client.aclose()
