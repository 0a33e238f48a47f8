from __future__ import annotations

import asyncio

import pytest

from connectors import SubmitState, TerminalWrite, open_result_store
from schemas.names import Names

pytestmark = pytest.mark.integration
NAMES = Names("t")


async def test_pending_records_never_overwrite(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES, ttl_s=120)
    try:
        assert await store.put_pending([("a", b"p1"), ("b", b"p1")]) == [SubmitState.NEW] * 2
        assert await store.put_pending([("a", b"p2")]) == [SubmitState.PENDING]
        assert await store.get_bodies(["a", "zzz"]) == [b"p1", None]
        await store.write_terminal([TerminalWrite("b", "succeeded", b"done")])
        assert await store.put_pending([("b", b"p3")]) == [SubmitState.TERMINAL]
        assert 0 < await store.redis.ttl(NAMES.result("a")) <= 120
    finally:
        await store.close()


async def test_first_terminal_result_wins_atomically(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    try:
        await store.put_pending([("x", b"pending")])
        first = await store.write_terminal([TerminalWrite("x", "failed", b"first")])
        again = await store.write_terminal([TerminalWrite("x", "succeeded", b"second")])
        assert (first, again) == ([True], [False])
        assert await store.get_bodies(["x"]) == [b"first"]
        # many concurrent writers for one ID: exactly one wins
        results = await asyncio.gather(*(
            store.write_terminal([TerminalWrite("race", "succeeded", str(i).encode())])
            for i in range(20)))
        assert sum(r[0] for r in results) == 1
    finally:
        await store.close()


async def test_older_generation_cannot_overwrite_a_replayed_request(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    try:
        await store.redis.hset(NAMES.result("g"), mapping={"status": "pending", "gen": 2,
                                                           "body": b"replayed"})
        assert await store.write_terminal([TerminalWrite("g", "failed", b"old", None, 1)]) \
            == [False]
        assert await store.write_terminal([TerminalWrite("g", "succeeded", b"new", None, 2)]) \
            == [True]
    finally:
        await store.close()


async def test_terminal_writes_announce_ids_once_per_client_channel(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(NAMES.notify_channel("c1"), NAMES.notify_channel("c2"))
        await store.write_terminal([
            TerminalWrite("r1", "succeeded", b"1", "c1"),
            TerminalWrite("r2", "succeeded", b"2", "c2"),
            TerminalWrite("r3", "failed", b"3", "c1"),
            TerminalWrite("r4", "failed", b"4", None),
        ])
        got: dict[str, set[str]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while len(got) < 2 and loop.time() < deadline:
            # None also means "a subscribe confirmation was skipped", so loop on time
            msg = await pubsub.get_message(timeout=0.5)
            if msg is not None:
                got[msg["channel"].decode()] = set(msg["data"].decode().split(","))
        assert got == {NAMES.notify_channel("c1"): {"r1", "r3"},
                       NAMES.notify_channel("c2"): {"r2"}}
    finally:
        await pubsub.aclose()
        await store.close()


async def test_delivery_counts_start_from_what_the_transport_left_uncounted(
        redis_url: str) -> None:
    """Redis skips counting first deliveries; a redelivery then says how many came before."""
    store = open_result_store(redis_url, NAMES)
    try:
        await store.put_pending([("d1", b"p"), ("d2", b"p")])
        # d1: attempt 1's first delivery went uncounted, so this reclaim is its second
        # d2: a transport that counts everything (Kafka), first delivery of attempt 1
        assert await store.count_deliveries([("d1", 1), ("d2", 0)]) == [(2, 0, -1), (1, 0, -1)]
        assert await store.count_deliveries([("d1", 1), ("d2", 0)]) == [(3, 0, -1), (2, 0, -1)]
        await store.write_terminal([TerminalWrite("d1", "succeeded", b"done")])
        assert (await store.count_deliveries([("d1", 1)]))[0][2] == 0  # done: ack, don't run
    finally:
        await store.close()
