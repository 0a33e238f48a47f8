"""The one-round-trip finish (``connectors.redis_finish``) against a real Redis: a
batch's results land and its entries are acked and deleted in one script call, a write
that fails acks nothing, and the path is taken only where the plane and the streams are
one single-node server."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from batchfleet import connectors
from batchfleet.connectors import Delivery, OutboundMessage, TerminalWrite
from batchfleet.connectors.redis_finish import OneTripFinish
from batchfleet.connectors.redis_streams import RedisStreamsConsumer, RedisStreamsPublisher
from batchfleet.connectors.result_store import ResultStore
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.integration

NS = "of"
NAMES = Names(NS)
MODEL = "demo-mlp"


async def _queued(url: str, ids: list[str], shards: int = 1
                  ) -> tuple[RedisStreamsConsumer, list[Delivery]]:
    """Publish one message per ID over ``shards`` streams and fetch them all."""
    publisher = RedisStreamsPublisher(aioredis.Redis.from_url(url), NAMES)
    consumer = RedisStreamsConsumer(aioredis.Redis.from_url(url), NAMES, "c1")
    await consumer.start([MODEL])
    await consumer.use_shards({MODEL: shards})
    await publisher.publish([OutboundMessage(MODEL, "interactive", rid, rid.encode(), None,
                                             shards) for rid in ids])
    await publisher.close()
    got: list[Delivery] = []
    while len(got) < len(ids):
        batch = await consumer.fetch(len(ids), 0.5)
        assert batch, f"fetched {len(got)} of {len(ids)}"
        got += batch
    return consumer, got


async def _left(raw: aioredis.Redis, shards: int) -> tuple[int, int]:
    """Entries still in the lane's streams, and entries still pending in the group."""
    streams = [NAMES.stream(MODEL, "interactive", s) for s in range(shards)]
    length = sum([await raw.xlen(s) for s in streams])
    pending = sum([(await raw.xpending(s, NAMES.consumer_group))["pending"]
                   for s in streams])
    return length, pending


async def _script_calls(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def _writes(deliveries: list[Delivery]) -> list[TerminalWrite]:
    return [TerminalWrite(d.payload.decode(), "succeeded", b"body-" + d.payload)
            for d in deliveries]


async def test_results_land_and_entries_go_in_one_call(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    store = ResultStore(aioredis.Redis.from_url(redis_url), NAMES)
    ids = [f"r{i}" for i in range(12)]
    consumer, got = await _queued(redis_url, ids, shards=3)
    finish = OneTripFinish(store, consumer.group)
    try:
        assert len({d.token[0] for d in got}) == 3  # the batch spans three streams
        await store.write_terminal([TerminalWrite(ids[0], "failed", b"first")])
        assert await finish.write_and_ack([], []) == []  # loads the script
        before = await _script_calls(raw)
        won = await finish.write_and_ack(_writes(got), got)
        assert await _script_calls(raw) - before == 1
        assert won == [d.payload != b"r0" for d in got]  # first wins, the loser is acked too
        assert await _left(raw, 3) == (0, 0)
        assert (await raw.hgetall(NAMES.result("r0")))[b"body"] == b"first"
        assert (await raw.hgetall(NAMES.result("r5")))[b"body"] == b"body-r5"
        # run again, as after a lost reply: nothing changes, nothing fails
        assert await finish.write_and_ack(_writes(got), got) == [False] * len(got)
        assert await _left(raw, 3) == (0, 0)
    finally:
        await consumer.close()
        await store.close()
        await raw.aclose()


async def test_a_write_that_fails_acks_nothing(redis_url: str) -> None:
    """The ack runs after every write in the same script: a write that raises leaves every
    entry pending, to be redelivered. Redis keeps the writes made before the error (a
    script is not rolled back), so the retry once the key is fixed finds those stored."""
    raw = aioredis.Redis.from_url(redis_url)
    store = ResultStore(aioredis.Redis.from_url(redis_url), NAMES)
    consumer, got = await _queued(redis_url, ["a", "b", "c"])
    finish = OneTripFinish(store, consumer.group)
    try:
        await raw.set(NAMES.result("c"), "not a hash")  # its HMGET fails with WRONGTYPE
        with pytest.raises(ResultStoreError, match="WRONGTYPE"):
            await finish.write_and_ack(_writes(got), got)
        assert await _left(raw, 1) == (3, 3)
        await raw.delete(NAMES.result("c"))
        assert await finish.write_and_ack(_writes(got), got) == [False, False, True]
        assert await _left(raw, 1) == (0, 0)
        for rid in ("a", "b", "c"):
            assert (await raw.hgetall(NAMES.result(rid)))[b"body"] == b"body-" + rid.encode()
    finally:
        await consumer.close()
        await store.close()
        await raw.aclose()


async def test_more_entries_than_one_unpack_takes(redis_url: str) -> None:
    """Lua's ``unpack`` refuses more than about 8,000 values ("too many results to
    unpack"): both ack scripts go 1,000 IDs at a time."""
    raw = aioredis.Redis.from_url(redis_url)
    store = ResultStore(aioredis.Redis.from_url(redis_url), NAMES)
    consumer, got = await _queued(redis_url, [f"r{i}" for i in range(17_000)])
    finish = OneTripFinish(store, consumer.group)
    try:
        assert len({d.token[0] for d in got}) == 1
        won = await finish.write_and_ack(_writes(got[:8500]), got[:8500])
        assert won == [True] * 8500 and await _left(raw, 1) == (8500, 8500)
        await consumer.ack(got[8500:])  # the consumer's own ack script, one stream
        assert await _left(raw, 1) == (0, 0)
    finally:
        await consumer.close()
        await store.close()
        await raw.aclose()


async def test_one_trip_finish_applies_only_to_one_single_node_server(redis_url: str
                                                                      ) -> None:
    broker = connectors.open_broker(redis_url, namespace=NS)
    plane = connectors.open_control_plane(redis_url, namespace=NS)
    other = connectors.open_control_plane(redis_url.rsplit("/", 1)[0] + "/1", namespace=NS)
    consumer = broker.consumer("c1")
    try:
        assert isinstance(broker, connectors.CombinedFinish)
        assert isinstance(broker.one_trip_finish(plane, consumer), OneTripFinish)
        assert broker.one_trip_finish(other, consumer) is None  # another database
        assert broker.one_trip_finish(plane, object()) is None  # a consumer it did not make
    finally:
        await consumer.close()
        await plane.close()
        await other.close()
