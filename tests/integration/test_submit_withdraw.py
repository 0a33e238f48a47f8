"""A submit whose publish fails leaves no pending record behind, so its retry is served."""

from __future__ import annotations

import socket

import pytest
import redis.asyncio as aioredis

from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.integration


def _dead_redis_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


async def test_a_failed_publish_withdraws_the_pending_record(redis_url: str) -> None:
    # results on a live Redis, the broker on a dead one: the record is written, the XADD fails
    async with AsyncClient(_dead_redis_url(), redis_url, namespace="tw",
                           check_model=False) as client:
        with pytest.raises(TransportError):
            await client.submit("demo-mlp", [0.0] * 10, request_id="order-1")
    raw = aioredis.Redis.from_url(redis_url)
    try:
        assert await raw.exists(Names("tw").result("order-1")) == 0
    finally:
        await raw.aclose()
    # and the retry, once the broker is back, is a fresh submit that gets published
    async with AsyncClient(redis_url, namespace="tw", check_model=False) as client:
        assert await client.submit("demo-mlp", [0.0] * 10, request_id="order-1") == "order-1"
        raw = aioredis.Redis.from_url(redis_url)
        try:
            assert await raw.xlen(Names("tw").stream("demo-mlp", "interactive")) == 1
        finally:
            await raw.aclose()
