"""A live worker keeps its leases, even while a batch computes past ``claim_idle_ms``
(its compute limit, not a lapse, bounds that: ``workers.containment``)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from batchfleet.connectors import BrokerURL, OutboundMessage
from batchfleet.schemas.names import Names
from batchfleet.workers.leases import Leases
from tests.support.seams import open_consumer, open_publisher

pytestmark = pytest.mark.integration
NAMES = Names("tl")


async def _idle_ms(client: aioredis.Redis) -> int:
    stream = NAMES.stream("m", "interactive")
    pending = await client.xpending_range(stream, NAMES.consumer_group, "-", "+", 10)
    return int(pending[0]["time_since_delivered"])


async def test_a_live_worker_keeps_refreshing_its_leases(redis_url: str) -> None:
    broker = BrokerURL.parse(redis_url)
    pub = open_publisher(broker, NAMES)
    con = open_consumer(broker, NAMES, "c1")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await con.start(["m"])
        await pub.publish([OutboundMessage("m", "interactive", "k", b"x")])
        leases = Leases(con, interval_s=0.05)
        assert len(leases.hold(await con.fetch(10, 0.5))) == 1
        task = asyncio.create_task(leases.run())
        await asyncio.sleep(0.6)
        idle = await _idle_ms(client)
        task.cancel()
        assert idle < 300  # refreshed every 50 ms
    finally:
        await client.aclose()
        await pub.close()
        await con.close()
