"""When the waiter may call a request lost: never for a result it already holds, and
never before a wait's own grace (``loss_grace_s``) has run from when that wait began."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from batchfleet.connectors import TerminalWrite
from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.producers.waiting import ResultWaiter
from batchfleet.schemas.envelopes import NOTIFY_RESULTS, Result, encode_result
from batchfleet.schemas.errors import RequestLostError, ValidationError
from batchfleet.schemas.names import Names
from tests.support.seams import control_plane_for, open_result_store

pytestmark = pytest.mark.integration
NAMES = Names("wl")


def _done(rid: str) -> TerminalWrite:
    body = encode_result(Result(rid, "succeeded", model="m"))
    # the SDK's waiter asks for bodies in its announcements (docs/wire-format.md §8)
    return TerminalWrite(rid, "succeeded", body, notify_channel="me",
                         notify_format=NOTIFY_RESULTS)


async def _until(done: Callable[[], bool], timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_results_already_received_survive_a_restart_that_empties_redis(
        redis_server: EmbeddedRedis) -> None:
    """Issue 23 #6: 500 results announced (held, not yet awaited) before Redis restarts
    empty are still returned by a later wait, without a read; only the expectation whose
    announcement never came is forgotten, so its wait finds the record gone (lost)."""
    store = open_result_store(redis_server.url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=0.2,
                          loss_grace_s=0.3)
    ids = [f"r{i}" for i in range(500)]
    try:
        await waiter.start()
        await store.put_pending([(rid, b"p") for rid in [*ids, "unannounced"]])
        waiter.expect([*ids, "unannounced"])
        await store.write_terminal([_done(rid) for rid in ids])
        await _until(lambda: all(waiter._expected[rid] is not None for rid in ids))
        await asyncio.to_thread(redis_server.restart)  # no persistence: comes back empty
        await _until(lambda: "unannounced" not in waiter._expected)  # noticed the drop
        fresh = aioredis.Redis.from_url(redis_server.url)
        assert await fresh.dbsize() == 0  # the store lost every record
        await fresh.aclose()
        with pytest.raises(RequestLostError) as lost:
            await waiter.wait_many([*ids, "unannounced"], timeout=15)
        assert lost.value.request_ids == ["unannounced"]
        assert [r and r.status for r in lost.value.results[:-1]] == ["succeeded"] * len(ids)
        assert waiter.body_reads < 50  # the 500 came from memory; only "unannounced" was read
    finally:
        await waiter.close()
        await store.close()


async def test_a_wait_started_before_the_submit_waits_its_own_grace(redis_url: str) -> None:
    """Issue 25 #23: the grace is a parameter of the wait and runs from when the wait
    began. With the waiter's default (0.3 s) an ID submitted 1.5 s later would be lost;
    a wait given 4 s gets its result, and an ID that never appears is still given up."""
    store = open_result_store(redis_url, NAMES)
    waiter = ResultWaiter(control_plane_for(store), NAMES, "me", poll_interval_s=0.2,
                          loss_grace_s=0.3)
    try:
        early = asyncio.create_task(waiter.wait_many(["later"], timeout=30, loss_grace_s=4.0))
        ghost = asyncio.create_task(waiter.wait_many(["ghost"], timeout=30, loss_grace_s=4.0))
        short = asyncio.create_task(waiter.wait_many(["later"], timeout=30))
        with pytest.raises(RequestLostError):
            await asyncio.wait_for(short, 10)  # the default grace ran out first
        await asyncio.sleep(1.5 - 0.3)  # well past the default grace of the others too
        assert not early.done() and not ghost.done()
        await store.put_pending([("later", b"p")])  # "another process" submits it now
        await store.write_terminal([_done("later")])
        assert [r.status for r in await asyncio.wait_for(early, 10)] == ["succeeded"]
        with pytest.raises(RequestLostError) as lost:
            await asyncio.wait_for(ghost, 15)
        assert lost.value.request_ids == ["ghost"]
        with pytest.raises(ValidationError):
            await waiter.wait_many(["x"], timeout=1, loss_grace_s=-1)
    finally:
        await waiter.close()
        await store.close()
