"""Both announcement formats against real Redis and a real ``batchfleet worker`` process
(docs/wire-format.md §8): a client written to the earlier document (comma-joined IDs,
no ``notify_format``) and the SDK (bodies, one hop) share one worker and both finish."""

from __future__ import annotations

import asyncio
import time

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Result, decode_result, encode_result

pytestmark = pytest.mark.e2e


def _old_request(rid: str, row: np.ndarray) -> bytes:
    """A request as the earlier wire doc told other languages to build it: no
    ``notify_format`` key (that document had none)."""
    return msgpack.packb({  # type: ignore[no-any-return]
        "v": 1, "id": rid, "model": "demo-mlp", "lane": "interactive",
        "enqueued_at": time.time(), "deadline_at": None, "callback_url": None,
        "notify": "old-client", "attempt": 1, "generation": 0, "errors": [],
        "inputs": {"dtype": "float32", "shape": [10], "data": row.tobytes()}},
        use_bin_type=True)


async def test_a_client_of_the_earlier_format_still_gets_its_results(redis_url: str) -> None:
    rows = np.random.default_rng(3).random((6, 10), dtype=np.float32)
    ids = [f"old-{i}" for i in range(len(rows))]
    redis = redis_client(redis_url)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    with WorkerProcess(redis_url).start().wait_ready():
        try:
            await pubsub.subscribe("bf:notify:old-client")  # before submitting (§8)
            pipe = redis.pipeline(transaction=False)
            for rid, row in zip(ids, rows, strict=True):
                pipe.hset(f"bf:result:{rid}", mapping={
                    "status": "pending", "gen": 0, "notify": "old-client",
                    "body": encode_result(Result(rid, "pending", model="demo-mlp"))})
                pipe.xadd("bf:stream:demo-mlp:interactive", {"p": _old_request(rid, row)})
            await pipe.execute()
            announced: list[str] = []
            deadline = time.monotonic() + 60  # liveness only
            while len(announced) < len(ids) and time.monotonic() < deadline:
                msg = await pubsub.get_message(timeout=0.5)
                if msg is not None:  # what such a client does with a message
                    announced += msg["data"].decode("utf-8").split(",")
            assert sorted(announced) == sorted(ids)
            bodies = [await redis.hget(f"bf:result:{rid}", "body") for rid in ids]
            assert {decode_result(b).status for b in bodies if b} == {"succeeded"}
            assert all(bodies)

            # the SDK, on the same worker, asks for bodies and reads nothing back
            async with AsyncClient(broker=redis_url, poll_interval_s=30) as client:
                await client.wait(await client.submit("demo-mlp", rows[0]), timeout=30)
                reads = client._waiter.body_reads
                sdk_ids = await client.submit_many("demo-mlp", rows)
                results = await client.wait_many(sdk_ids, timeout=30)
                assert client._waiter.body_reads == reads
            assert {r.status for r in results} == {"succeeded"}
        finally:
            await pubsub.aclose()
            await redis.aclose()


async def test_the_sdk_reads_back_a_cancel_announced_by_id(redis_url: str) -> None:
    """A cancel announces the ID alone (§8): the SDK's wait reads it back and ends."""
    async with AsyncClient(broker=redis_url, poll_interval_s=30, check_model=False) as client:
        rid = await client.submit("demo-mlp", np.zeros(10, np.float32))  # no worker runs it
        waiting = asyncio.ensure_future(client.wait(rid, timeout=30))
        await asyncio.sleep(0.2)
        await client.cancel(rid)
        result = await waiting
    assert result.status == "cancelled"
