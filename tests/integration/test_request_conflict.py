"""A caller-chosen request ID reused with other inputs is refused, not silently answered
with the first request's result (issue 25 #9); reused with the same ones it is an
idempotent resubmit. On both submit paths: one script (results on the broker's Redis)
and two calls (results elsewhere)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from batchfleet import BatchfleetError, RequestConflictError
from batchfleet.producers import AsyncClient
from batchfleet.producers.client import new_request_id
from batchfleet.producers.gateway.problems import status_for
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.integration
NS = "rc"
A, B = [0.0] * 10, [1.0] * 10


@pytest.mark.parametrize("results_db", [None, 1], ids=["one-trip", "two-calls"])
async def test_a_reused_id_with_other_inputs_raises_and_enqueues_nothing(
        redis_url: str, results_db: int | None) -> None:
    results = None if results_db is None else redis_url.rsplit("/", 1)[0] + f"/{results_db}"
    stream = Names(NS).stream("demo-mlp", "interactive")
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with AsyncClient(redis_url, results, namespace=NS, check_model=False) as client:
            assert await client.submit("demo-mlp", A, request_id="order-1") == "order-1"
            # the same request again: an idempotent resubmit (a pending one is re-sent)
            assert await client.submit("demo-mlp", A, request_id="order-1") == "order-1"
            with pytest.raises(RequestConflictError) as refused:
                await client.submit("demo-mlp", B, request_id="order-1")
            assert refused.value.request_ids == ["order-1"] and "order-1" in str(refused.value)
            assert isinstance(refused.value, BatchfleetError)
            assert status_for(refused.value) == 409  # what the gateway answers for it
            with pytest.raises(RequestConflictError):  # another model is another request
                await client.submit("other-model", A, request_id="order-1")
            assert await raw.xlen(stream) == 2
            # coalesced with a good submit into one send: only the conflicting one fails
            bad, good = await asyncio.gather(
                client.submit("demo-mlp", B, request_id="order-1"),
                client.submit("demo-mlp", B, request_id="order-2"), return_exceptions=True)
            assert isinstance(bad, RequestConflictError) and good == "order-2"
            with pytest.raises(RequestConflictError) as many:
                await client.submit_many("demo-mlp", [B, A, B],
                                         request_ids=["order-1", "order-3", "order-2"])
            assert many.value.request_ids == ["order-1"]
            assert many.value.accepted == ["order-3", "order-2"]
            assert await raw.xlen(stream) == 2 + 1 + 2
            # an ID the SDK made (no fingerprint) resubmitted by the caller is accepted
            made = await client.submit("demo-mlp", A)
            assert await client.submit("demo-mlp", A, request_id=made) == made
    finally:
        await raw.aclose()


async def test_ids_the_caller_made_with_an_empty_fingerprint_are_not_hashed(
        redis_url: str) -> None:
    """Review finding 3: the gateway and the bench make their IDs with new_request_id and
    pass ``fingerprint=""``; no fingerprint is computed or stored for them."""
    names = Names(NS)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        async with AsyncClient(redis_url, namespace=NS, check_model=False) as client:
            one = await client.submit("demo-mlp", A, request_id=new_request_id(),
                                      fingerprint="")
            many = await client.submit_many("demo-mlp", [A, B], fingerprint="",
                                            request_ids=[new_request_id(), new_request_id()])
            chosen = await client.submit("demo-mlp", A, request_id=new_request_id())
            fps = [await raw.hget(names.result(rid), "fp") for rid in [one, *many, chosen]]
            assert fps[:3] == [None, None, None] and fps[3] is not None
            assert await raw.hget(names.result(one), "status") == b"pending"
    finally:
        await raw.aclose()
