"""The one-round-trip submit (``connectors.redis_submit``) against a real Redis: the same
answers as the two-call path, one script call per flush, and nothing left behind when
an XADD fails."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.redis_streams import RedisStreamsPublisher
from batchfleet.connectors.redis_submit import OneTripSubmit
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.values import Ownership, SubmitState, TerminalWrite
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import Names
from tests.support.seams import one_trip_for

pytestmark = pytest.mark.integration

NS = "ot"


def _message(rid: str, shards: int = 1) -> OutboundMessage:
    return OutboundMessage("demo-mlp", "interactive", rid, f"payload-{rid}".encode(), None,
                           shards)


async def _script_calls(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def test_states_and_messages_match_the_two_call_path(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    store = ResultStore(aioredis.Redis.from_url(redis_url), Names(NS))
    one_trip = OneTripSubmit(store)
    names = Names(NS)
    try:
        await store.put_pending([("done", b"p")])
        await store.write_terminal([TerminalWrite("done", "succeeded", b"body")])
        await store.put_pending([("taken", b"p")], [Ownership("k1", "fp-a", None)])
        await store.put_pending([("waiting", b"p")])
        ids = ["fresh", "waiting", "done", "taken"]
        owners = [Ownership("k2", None, "me"), Ownership(None, None, "me"),
                  Ownership(None, None, "me"), Ownership("k1", "fp-b", "me")]
        states = await one_trip.submit([(rid, b"pending-" + rid.encode()) for rid in ids],
                                       owners, [_message(rid, shards=4) for rid in ids])
        assert states == [SubmitState.NEW, SubmitState.PENDING, SubmitState.TERMINAL,
                          SubmitState.CONFLICT]
        # new and pending ones are queued, on their own shard; finished and conflicting not
        queued = {}
        for shard in range(4):
            for _, fields in await raw.xrange(names.stream("demo-mlp", "interactive", shard)):
                queued[fields[b"p"]] = shard
        assert set(queued) == {b"payload-fresh", b"payload-waiting"}
        record = await raw.hgetall(names.result("fresh"))
        assert record[b"status"] == b"pending" and record[b"owner"] == b"k2"
        assert record[b"notify"] == b"me" and record[b"body"] == b"pending-fresh"
        assert 0 < await raw.ttl(names.result("fresh")) <= store.ttl_s
        assert (await raw.hgetall(names.result("done")))[b"status"] == b"succeeded"
    finally:
        await store.close()
        await raw.aclose()


async def test_a_failed_xadd_leaves_no_record_and_the_retry_is_served(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    names = Names(NS)
    store = ResultStore(aioredis.Redis.from_url(redis_url), names)
    one_trip = OneTripSubmit(store)
    stream = names.stream("demo-mlp", "interactive")
    try:
        await raw.set(stream, "not a stream")  # every XADD to it fails with WRONGTYPE
        with pytest.raises(TransportError, match="WRONGTYPE"):
            await one_trip.submit([("a", b"p"), ("b", b"p")], [Ownership(None, None, None)] * 2,
                                  [_message("a"), _message("b")])
        assert await raw.exists(names.result("a"), names.result("b")) == 0
        await raw.delete(stream)
        states = await one_trip.submit([("a", b"p")], [Ownership(None, None, None)],
                                       [_message("a")])
        assert states == [SubmitState.NEW] and await raw.xlen(stream) == 1
    finally:
        await store.close()
        await raw.aclose()


async def test_the_sdk_sends_a_lone_submit_in_one_script_call(redis_url: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with AsyncClient(redis_url, namespace=NS, check_model=False) as client:
            await client.submit("demo-mlp", [0.0] * 10)  # warm: loads the script
            before = await _script_calls(raw)
            for i in range(5):
                await client.submit("demo-mlp", [float(i)] * 10, request_id=f"lone-{i}")
            assert await _script_calls(raw) - before == 5
            # concurrent ones share the call
            before = await _script_calls(raw)
            await asyncio.gather(*(client.submit("demo-mlp", [0.0] * 10) for _ in range(50)))
            assert await _script_calls(raw) - before <= 3
        assert await raw.xlen(Names(NS).stream("demo-mlp", "interactive")) == 56
    finally:
        await raw.aclose()


async def test_one_trip_applies_only_to_one_single_node_server(redis_url: str) -> None:
    names = Names(NS)
    store = ResultStore(aioredis.Redis.from_url(redis_url), names)
    publisher = RedisStreamsPublisher(aioredis.Redis.from_url(redis_url), names)
    try:
        assert isinstance(one_trip_for(store, publisher, same_server=True), OneTripSubmit)
        assert one_trip_for(store, publisher, same_server=False) is None
        assert one_trip_for(store, object(), same_server=True) is None
    finally:
        await store.close()
        await publisher.close()
