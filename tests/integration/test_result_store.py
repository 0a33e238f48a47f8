from __future__ import annotations

import asyncio

import numpy as np
import pytest

from batchfleet.connectors import SubmitState, TerminalWrite
from batchfleet.connectors.announcements import parse_announcement
from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.connectors.values import DeadLetter, Lettered, Retry
from batchfleet.schemas.envelopes import NOTIFY_RESULTS as R
from batchfleet.schemas.envelopes import Request, encode_request
from batchfleet.schemas.names import Names
from tests.support.seams import open_result_store

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


async def test_terminal_writes_announce_results_once_per_client_channel(redis_url: str
                                                                        ) -> None:
    """One message per client channel carries that client's (ID, body) pairs: one hop."""
    store = open_result_store(redis_url, NAMES)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(NAMES.notify_channel("c1"), NAMES.notify_channel("c2"))
        await store.write_terminal([
            TerminalWrite("r1", "succeeded", b"1", "c1", notify_format=R),
            TerminalWrite("r2", "succeeded", b"2", "c2", notify_format=R),
            TerminalWrite("r3", "failed", b"3", "c1", notify_format=R),
            TerminalWrite("r4", "failed", b"4", None),
        ])
        got: dict[str, set[tuple[str, bytes]]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while len(got) < 2 and loop.time() < deadline:
            # None also means "a subscribe confirmation was skipped", so loop on time
            msg = await pubsub.get_message(timeout=0.5)
            if msg is not None:
                got[msg["channel"].decode()] = set(parse_announcement(msg["data"]))
        assert got == {NAMES.notify_channel("c1"): {("r1", b"1"), ("r3", b"3")},
                       NAMES.notify_channel("c2"): {("r2", b"2")}}
        # a write that loses (already terminal) announces nothing
        await store.write_terminal([TerminalWrite("r1", "succeeded", b"again", "c1",
                                                  notify_format=R)])
        assert await pubsub.get_message(timeout=0.5) is None
    finally:
        await pubsub.aclose()
        await store.close()


async def test_announcements_frame_every_size_of_batch_and_body(redis_url: str) -> None:
    """Every msgpack header the script writes by hand: bodies of 0, 255, 256 and 65,536
    bytes (bin8/16/32), IDs of 31, 32 and 128 bytes (fixstr/str8), and arrays of 2 and
    78 elements (fixarray/array16)."""
    store = open_result_store(redis_url, NAMES)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    bodies = [b"", b"a" * 255, b"b" * 256, b"c" * 65_536, bytes(range(256)) * 3]
    ids = ["x" * 31, "y" * 32, "z" * 128, "w", "v-4"] + [f"many-{i}" for i in range(35)]
    writes = [TerminalWrite(rid, "succeeded", bodies[i % len(bodies)], "big",
                            notify_format=R)
              for i, rid in enumerate(ids)]
    try:
        await pubsub.subscribe(NAMES.notify_channel("big"))
        await pubsub.get_message(timeout=1.0)
        for batch in (writes[:1], writes[1:]):
            await store.write_terminal(batch)
            msg = None
            for _ in range(20):
                msg = msg or await pubsub.get_message(timeout=0.5)
            assert msg is not None
            assert parse_announcement(msg["data"]) == [(w.request_id, w.body) for w in batch]
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
        assert await store.count_deliveries([("d1", 1), ("d2", 0)]) == [(2, 0, -1, 0),
                                                                        (1, 0, -1, 0)]
        assert await store.count_deliveries([("d1", 1), ("d2", 0)]) == [(3, 0, -1, 0),
                                                                        (2, 0, -1, 0)]
        await store.write_terminal([TerminalWrite("d1", "succeeded", b"done")])
        assert (await store.count_deliveries([("d1", 1)]))[0][2] == 0  # done: ack, don't run
    finally:
        await store.close()


async def test_a_first_delivery_is_only_read_and_sees_the_current_generation(
        redis_url: str) -> None:
    """A retry's or replay's first delivery is checked for staleness without being counted."""
    store = open_result_store(redis_url, NAMES)
    try:
        await store.put_pending([("g1", b"p")])
        await store.write_terminal([TerminalWrite("g1", "failed", b"f")])
        assert await store.reopen_for_replay([("g1", b"p")]) == [1]
        # read only (-1): no count, the record's generation 1, nothing terminal
        assert await store.count_deliveries([("g1", -1)]) == [(0, 0, -1, 1)]
        assert await store.redis.hget(NAMES.result("g1"), "deliveries") == b"0"
        # the largest generation Lua compares exactly survives the round trip
        big = 2**53 - 1
        await store.redis.hset(NAMES.result("g1"), "gen", big)
        assert (await store.count_deliveries([("g1", -1)]))[0].gen == big
    finally:
        await store.close()


async def test_the_dlq_keeps_one_letter_per_id_and_generation_and_refuses_stale_ones(
        redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    dlq = DeadLetterQueue(store.redis, NAMES)
    try:
        await store.put_pending([("s1", b"p")])
        letter = DeadLetter("s1", "m", b"env", 3, [], "model_error")
        assert await dlq.add([letter, letter]) == [Lettered.ADDED, Lettered.KNOWN]
        await store.write_terminal([TerminalWrite("s1", "failed", b"f")])
        assert await store.reopen_for_replay([("s1", b"p")]) == [1]
        # the old generation's copy is stale; the replayed one may be dead-lettered once
        gen1 = DeadLetter("s1", "m", b"env", 3, [], "model_error", generation=1)
        assert await dlq.add([letter, gen1, gen1]) == [Lettered.STALE, Lettered.ADDED,
                                                      Lettered.KNOWN]
        assert [(dl.request_id, dl.generation) for dl in await dlq.list("m")] == [
            ("s1", 0), ("s1", 1)]
    finally:
        await store.close()


async def test_retries_are_scheduled_only_while_live_at_their_generation(
        redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    schedule = RetrySchedule(store.redis, NAMES)
    try:
        await store.put_pending([("live", b"p"), ("done", b"p"), ("old", b"p")])
        await store.write_terminal([TerminalWrite("done", "succeeded", b"s"),
                                    TerminalWrite("old", "failed", b"f")])
        await store.reopen_for_replay([("old", b"p")])
        assert await schedule.add_live([Retry(1.0, b"e1", "live", 0), Retry(1.0, b"e2", "done", 0),
                                        Retry(1.0, b"e3", "old", 0), Retry(1.0, b"e4", "old", 1),
                                        Retry(1.0, b"e5", "unknown", 0)]) == [
            True, False, False, True, True]
        assert await schedule.size() == 3
    finally:
        await store.close()


async def test_dlq_operations_page_through_more_than_a_thousand_letters(
        redis_url: str) -> None:
    """list, replay and purge each see every one of 2,500 letters (no 1,000 cap)."""
    from batchfleet.dlq import DeadLetterOps, Selection

    names = Names("bf")
    store = open_result_store(redis_url, names)
    dlq = DeadLetterQueue(store.redis, names)
    n = 2500
    ids = [f"p{i}" for i in range(n)]
    envelopes = [encode_request(Request(rid, "pm", np.zeros(10, np.float32))) for rid in ids]
    ops = DeadLetterOps(redis_url, None)
    try:
        assert await dlq.add([DeadLetter(rid, "pm", env, 3, [{"type": "model_error"}],
                                         "model_error") for rid, env in zip(ids, envelopes,
                                                                             strict=True)]
                             ) == [Lettered.ADDED] * n
        listed = await ops.letters("pm")
        assert len(listed) == n and len({dl.request_id for dl in listed}) == n
        assert len(await ops.letters()) == n  # every model, via the DLQ model set
        # replay: records are failed, so every one is reopened, published and removed
        await store.write_terminal([TerminalWrite(rid, "failed", b"f") for rid in ids])
        report = await ops.replay_selected(Selection(model="pm"))
        assert len(report.replayed) == n and not report.skipped
        assert await dlq.size("pm") == 0
        assert await store.redis.xlen(names.stream("pm", "interactive")) == n
        # the replayed generation dead-letters again; purge sees all of them
        assert await dlq.add([DeadLetter(rid, "pm", env, 3, [], "model_error", generation=1)
                              for rid, env in zip(ids, envelopes, strict=True)]
                             ) == [Lettered.ADDED] * n
        assert await ops.purge("pm") == n
        assert await ops.letters() == []
    finally:
        await ops.close()
        await store.close()


async def test_a_replay_starts_the_stall_count_again(redis_url: str) -> None:
    """A request quarantined as ``stalled`` and replayed once the model is fixed is not
    quarantined at its next single stall."""
    store = open_result_store(redis_url, NAMES)
    try:
        await store.put_pending([("st1", b"p")])
        assert await store.note_stalls(["st1"]) == [1]
        assert await store.note_stalls(["st1"]) == [2]
        await store.write_terminal([TerminalWrite("st1", "failed", b"f")])
        assert await store.reopen_for_replay([("st1", b"p")]) == [1]
        assert await store.note_stalls(["st1"]) == [1]
    finally:
        await store.close()


async def test_stall_and_solo_counts_never_leave_a_record_without_a_ttl(redis_url: str
                                                                        ) -> None:
    """Counted on a record that is gone (expired, or a first delivery never wrote it), the
    record they create expires like any other (a bare HINCRBY's would stay for good);
    the delivery count's script tells a new record from the fields it reads."""
    store = open_result_store(redis_url, NAMES)
    try:
        assert await store.note_stalls(["gone1", "gone2"]) == [1, 1]
        await store.mark_solo("gone3", started=True)
        await store.put_pending([("kept", b"p")])
        await store.mark_solo("kept", started=True)
        await store.mark_solo("kept", started=False, attempt=3)
        # a delivery counted where no record is (Kafka's raw producers write none)
        assert [c.deliveries for c in await store.count_deliveries([("gone4", 0)])] == [1]
        r = store.redis
        for rid in ("gone1", "gone2", "gone3", "gone4", "kept"):
            assert 0 < await r.ttl(NAMES.result(rid)) <= store.ttl_s, rid
        assert await r.hmget(NAMES.result("kept"), "solo", "deliveries", "status") == [
            b"0", b"3", b"pending"]
    finally:
        await store.close()
