"""The SDK's waiter: announcements resolve waits, even ones that arrive before the wait."""

from __future__ import annotations

import asyncio

import pytest

from connectors import TerminalWrite, open_result_store
from producers.waiting import ResultWaiter
from schemas.envelopes import Result, encode_result
from schemas.names import Names

pytestmark = pytest.mark.integration
NAMES = Names("tw")
#: Far longer than any wait below: a result that arrives came from the announcement.
NO_POLL_S = 60.0


def _done(rid: str) -> TerminalWrite:
    body = encode_result(Result(rid, "succeeded", model="m"))
    return TerminalWrite(rid, "succeeded", body, notify_channel="me")


async def test_expected_ids_resolve_from_announcements_alone(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(store, NAMES, "me", poll_interval_s=NO_POLL_S)
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
    finally:
        await waiter.close()
        await store.close()


async def test_unexpected_ids_are_read_first(redis_url: str) -> None:
    """An ID this client did not submit (another process's) is found by the first read."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(store, NAMES, "me", poll_interval_s=NO_POLL_S)
    try:
        write = _done("theirs")
        await store.write_terminal([TerminalWrite(write.request_id, write.status, write.body)])
        (result,) = await waiter.wait_many(["theirs"], timeout=5)
        assert result.status == "succeeded"
    finally:
        await waiter.close()
        await store.close()
