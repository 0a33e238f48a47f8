"""The SDK's waiter: announcements resolve waits, even ones that arrive before the wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from batchfleet.connectors import TerminalWrite
from batchfleet.producers.waiting import ResultWaiter
from batchfleet.schemas.envelopes import NOTIFY_RESULTS, Result, encode_result
from batchfleet.schemas.errors import RequestLostError
from batchfleet.schemas.names import Names
from tests.support.seams import control_plane_for, open_result_store

pytestmark = pytest.mark.integration
NAMES = Names("tw")
#: Far longer than any wait below: a result that arrives came from the announcement.
NO_POLL_S = 60.0


def _done(rid: str) -> TerminalWrite:
    body = encode_result(Result(rid, "succeeded", model="m"))
    return TerminalWrite(rid, "succeeded", body, notify_channel="me",
                         notify_format=NOTIFY_RESULTS)


async def test_expected_ids_resolve_from_announcements_alone(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=NO_POLL_S)
    try:
        await waiter.start()
        await store.put_pending([(rid, b"p") for rid in ("early", "late")])
        waiter.expect(["early", "late"])
        await store.write_terminal([_done("early")])  # finished before anyone waits
        await asyncio.sleep(0.2)  # let the listener take the announcement
        waiting = asyncio.create_task(waiter.wait_many(["early", "late"], timeout=5))
        await asyncio.sleep(0.1)
        await store.write_terminal([_done("late")])
        results = await waiting
        assert [(r.request_id, r.status) for r in results] == [
            ("early", "succeeded"), ("late", "succeeded")]
        assert not waiter._expected  # taken by the wait, nothing left behind
        assert waiter.body_reads == 0  # one hop: the bodies came with the announcements
    finally:
        await waiter.close()
        await store.close()


async def test_results_announced_while_the_subscription_is_down_are_read_on_reconnect(
        redis_url: str) -> None:
    """Pub/sub is at-most-once: a reconnect reads every outstanding wait at once, so
    nothing announced into the gap is missed, and nothing waits for the slow poll."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=NO_POLL_S)
    try:
        await waiter.start()
        ids = ["gap-1", "gap-2", "after"]
        await store.put_pending([(rid, b"p") for rid in ids])
        waiter.expect(ids)
        waiting = asyncio.create_task(waiter.wait_many(ids, timeout=15))
        await asyncio.sleep(0.1)
        assert await store.redis.client_kill_filter(_type="pubsub") >= 1
        # the server dropped the subscriber: these announcements reach no one
        await store.write_terminal([_done("gap-1"), _done("gap-2")])
        await asyncio.sleep(0.5)  # reconnected by now (backoff 0.1 s)
        await store.write_terminal([_done("after")])
        results = await waiting
        assert [r.request_id for r in results] == ids
        assert all(r.status == "succeeded" for r in results)
    finally:
        await waiter.close()
        await store.close()


async def test_a_slow_safety_poll_holds_no_announcement(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poll reads beside the announcements: while one is held inside its first read
    (as one over 100,000 outstanding IDs takes seconds), an announced result still ends
    its wait at once. Before, the listener ran the poll itself, so the result waited."""
    store = open_result_store(redis_url, NAMES)
    entered, release = asyncio.Event(), asyncio.Event()
    real_lane_losses = store.lane_losses

    async def held_lane_losses() -> dict[str, int]:
        entered.set()
        await release.wait()
        return await real_lane_losses()

    monkeypatch.setattr(store, "lane_losses", held_lane_losses)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=0.1)
    try:
        await waiter.start()
        await store.put_pending([("soon", b"p")])
        waiter.expect(["soon"])
        waiting = asyncio.create_task(waiter.wait_many(["soon"], timeout=15))
        await asyncio.wait_for(entered.wait(), 15)  # a poll is now held mid-read
        await store.write_terminal([_done("soon")])
        # the poll is released only in the finally below: this ends while it is held
        (result,) = await asyncio.wait_for(waiting, 10)
        assert result.status == "succeeded"
        assert waiter.body_reads == 0  # by the announcement, not a read
    finally:
        release.set()
        await waiter.close()
        await store.close()


async def test_unexpected_ids_are_read_first(redis_url: str) -> None:
    """An ID this client did not submit (another process's) is found by the first read."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=NO_POLL_S)
    try:
        write = _done("theirs")
        await store.write_terminal([TerminalWrite(write.request_id, write.status, write.body)])
        (result,) = await waiter.wait_many(["theirs"], timeout=5)
        assert result.status == "succeeded"
        assert waiter.body_reads == 1
    finally:
        await waiter.close()
        await store.close()


async def test_wait_on_an_id_that_never_existed_ends_with_request_lost(redis_url: str) -> None:
    """No record, and none appears: even timeout=None ends within a few seconds."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=0.2,
                          loss_grace_s=0.5)
    try:
        with pytest.raises(RequestLostError) as lost:
            await asyncio.wait_for(waiter.wait_many(["ghost"], timeout=None), 15)
        assert lost.value.request_ids == ["ghost"] and "ghost" in str(lost.value)
    finally:
        await waiter.close()
        await store.close()


async def test_pending_request_on_a_lost_lane_ends_and_others_finish(redis_url: str) -> None:
    """wait_many's contract: the lost IDs are named once the rest have finished, and
    the results that did arrive are on the exception, in request order."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=0.2,
                          loss_grace_s=0.5)
    try:
        def pending(rid: str, enqueued_at: float) -> tuple[str, bytes]:
            return rid, encode_result(Result(rid, "pending", model="m",
                                             enqueued_at=enqueued_at))

        now = time.time()
        await store.put_pending([pending("before", now - 60), pending("after", now + 60),
                                 pending("done", now - 60)])
        waiting = asyncio.create_task(waiter.wait_many(["before", "done", "after"], 15))
        await store.mark_lane_losses({"m:interactive": int(now * 1000)})
        await store.write_terminal([_done("done")])
        await asyncio.sleep(2.0)
        assert not waiting.done()  # "after" was enqueued after the loss: still pending
        await store.write_terminal([_done("after")])
        with pytest.raises(RequestLostError) as lost:
            await waiting
        assert lost.value.request_ids == ["before"]
        assert [r and r.status for r in lost.value.results] == [None, "succeeded", "succeeded"]
    finally:
        await waiter.close()
        await store.close()


async def test_expect_keeps_an_arrived_result_and_unexpect_undoes_only_its_own(
        redis_url: str) -> None:
    """The one-trip submit expects IDs before it knows they are new, then undoes what it
    added for those that were not: an announced body is kept, an earlier expectation too."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=NO_POLL_S)
    try:
        await waiter.start()
        await store.put_pending([(rid, b"p") for rid in ("done", "mine")])
        assert waiter.expect(["done", "mine"]) == {"done", "mine"}
        await store.write_terminal([_done("done")])
        await asyncio.sleep(0.2)  # the announcement is held for a later wait
        # a duplicate submit of both: nothing new to expect, and undoing it changes nothing
        added = waiter.expect(["done", "mine", "other"])
        assert added == {"other"}
        waiter.unexpect(added)
        assert set(waiter._expected) == {"done", "mine"}
        [result] = await waiter.wait_many(["done"], timeout=5)
        assert result.status == "succeeded" and waiter.body_reads == 0  # the held body
    finally:
        await waiter.close()
        await store.close()
