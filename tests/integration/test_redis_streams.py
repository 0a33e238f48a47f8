from __future__ import annotations

import asyncio

import pytest

from batchfleet.connectors import BrokerURL, OutboundMessage
from batchfleet.schemas.names import Names
from tests.support.seams import open_consumer, open_publisher

pytestmark = pytest.mark.integration
NAMES = Names("t")


def _messages(n: int, lane: str = "interactive", model: str = "m") -> list[OutboundMessage]:
    return [OutboundMessage(model, lane, f"{lane}-{i}", f"{lane}-{i}".encode())
            for i in range(n)]


async def test_publish_fetch_ack_deletes_entries(redis_url: str) -> None:
    broker = BrokerURL.parse(redis_url)
    pub = open_publisher(broker, NAMES)
    con = open_consumer(broker, NAMES, "c1")
    try:
        await con.start(["m"])
        await pub.publish(_messages(10))
        got = await con.fetch(100, 0.5)
        assert [d.payload for d in got] == [f"interactive-{i}".encode() for i in range(10)]
        assert {b.depth for b in await con.backlog() if b.lane == "interactive"} == {10}
        await con.ack(got)
        assert {b.depth for b in await con.backlog()} == {0}  # XACK + XDEL: stream = backlog
        assert await con.fetch(10, 0.05) == []
    finally:
        await pub.close()
        await con.close()


async def test_interactive_lane_comes_first(redis_url: str) -> None:
    broker = BrokerURL.parse(redis_url)
    pub = open_publisher(broker, NAMES)
    con = open_consumer(broker, NAMES, "c1")
    try:
        await con.start(["m"])
        await pub.publish(_messages(5, "bulk") + _messages(5, "interactive"))
        lanes = [d.lane for d in await con.fetch(100, 0.5)]
        assert lanes == ["interactive"] * 5 + ["bulk"] * 5
    finally:
        await pub.close()
        await con.close()


async def test_idle_entries_of_a_dead_consumer_are_reclaimed(redis_url: str) -> None:
    broker = BrokerURL.parse(redis_url)
    pub = open_publisher(broker, NAMES)
    dead = open_consumer(broker, NAMES, "dead", claim_idle_ms=100)
    alive = open_consumer(broker, NAMES, "alive", claim_idle_ms=100)
    try:
        await dead.start(["m"])
        await alive.start(["m"])
        await pub.publish(_messages(7))
        assert len(await dead.fetch(100, 0.5)) == 7  # fetched, never acked: "crashed"
        assert await alive.fetch(100, 0.05) == []
        await asyncio.sleep(0.2)
        reclaimed = await alive.fetch(100, 0.05)
        assert sorted(d.payload for d in reclaimed) == sorted(
            f"interactive-{i}".encode() for i in range(7))
        assert all(d.delivery_count >= 2 for d in reclaimed)
        await alive.ack(reclaimed)
        assert {b.depth for b in await alive.backlog()} == {0}
    finally:
        for c in (pub, dead, alive):
            await c.close()
