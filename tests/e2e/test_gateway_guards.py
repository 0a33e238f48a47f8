"""Bodies and callback URLs the gateway must refuse cleanly. Real uvicorn and Redis.

* A body whose ``dtype``, ``priority`` or ``deadline_s`` is the wrong kind of JSON value
  (a list, an object, a 400-digit integer) is a 422 naming the field, never a 500, and the
  keep-alive connection it came on serves the next request.
* A callback URL that embeds a private IPv4 address in IPv6 (SIIT ``::ffff:0:0:0/96``,
  ISATAP ``::5efe:``) is refused at submit by the gateway and the SDK, even with http
  allowed, and again at delivery by the webhook job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.values import TerminalWrite
from batchfleet.producers import AsyncClient
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from batchfleet.schemas.envelopes import Result, encode_result
from batchfleet.schemas.errors import CallbackRefusedError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration
from tests.support.gateway_main import live_gateway
from tests.support.receiver import Receiver
from tests.support.seams import open_result_store

pytestmark = pytest.mark.e2e

NS = "gwguard"
KEY = "k-guard"
#: http allowed, loopback explicitly allowed: the lenient set-up the issue saw a 202 under.
LENIENT = CallbackPolicy.parse("http,https", "", "127.0.0.0/8")
EMBEDDED = ["[::ffff:0:10.0.0.5]", "[::ffff:0:a00:5]", "[::ffff:0:169.254.169.254]",
            "[::5efe:a00:5]", "[2606:4700::200:5efe:192.168.0.1]"]
BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"dtype": []}, "dtype must be one of"),
    ({"dtype": {}}, "dtype must be one of"),
    ({"dtype": ["float32"]}, "dtype must be one of"),
    ({"priority": []}, "priority must be one of"),
    ({"priority": {}}, "priority must be one of"),
    ({"deadline_s": 10**400}, "deadline_s must be a positive number"),
    ({"deadline_s": -(10**400)}, "deadline_s must be a positive number"),
]


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    settings = GatewaySettings(broker=redis_url, namespace=NS, callback_policy=LENIENT,
                               keys=KeyRing.parse(f"guard:{hash_key(KEY)}:*"))
    with live_gateway(settings) as base:
        yield base


async def _declare(redis_url: str) -> None:
    registry = open_model_registry(redis_url, Names(NS))
    await registry.declare("demo-mlp", Declaration(0.0))
    await registry.close()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    body: bytes) -> tuple[int, dict[str, Any]]:
    """One HTTP/1.1 POST on an open connection; (status, JSON body)."""
    writer.write(b"POST /v1/models/demo-mlp/requests HTTP/1.1\r\nHost: t\r\n"
                 b"X-API-Key: " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)).decode()
    status = int(head.split(" ", 2)[1])
    headers = dict(line.lower().split(": ", 1) for line in head.split("\r\n")[1:] if line)
    assert headers.get("connection") != "close", head
    payload = await reader.readexactly(int(headers["content-length"]))
    return status, json.loads(payload)


async def test_bad_bodies_are_422s_and_the_connection_serves_the_next_request(
        gateway: str, redis_url: str) -> None:
    await _declare(redis_url)
    host, port = gateway.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    good = json.dumps({"inputs": [0.5] * 10}).encode()
    try:
        for fields, message in BAD_BODIES:
            body = json.dumps({"inputs": [0.5] * 10, **fields}).encode()
            status, answer = await _exchange(reader, writer, body)
            assert status == 422, (fields, answer)
            assert answer["error"]["type"] == "validation_error"
            assert answer["error"]["message"].startswith(message), answer
            assert len(answer["error"]["message"]) < 200  # no 400-digit echo
            status, answer = await _exchange(reader, writer, good)  # same connection
            assert status == 202 and answer["status"] == "pending", answer
    finally:
        writer.close()
        await writer.wait_closed()


async def test_embedded_private_addresses_are_refused_at_submit_and_at_delivery(
        gateway: str, redis_url: str) -> None:
    import httpx
    import redis as sync_redis

    from batchfleet.connectors.webhook_jobs import DeliveryConfig, deliver

    await _declare(redis_url)
    urls = [f"{scheme}://{host}:8080/hook" for host in EMBEDDED for scheme in ("http", "https")]
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
        for url in urls:
            res = await http.post("/v1/models/demo-mlp/requests", headers={"X-API-Key": KEY},
                                  json={"inputs": [0.5] * 10, "callback_url": url})
            assert res.status_code == 422, (url, res.text)
            assert res.json()["error"]["type"] == "callback_refused"
    async with AsyncClient(redis_url, namespace=NS, callback_policy=LENIENT) as sdk:
        for url in urls:
            with pytest.raises(CallbackRefusedError):
                await sdk.submit("demo-mlp", [0.5] * 10, callback_url=url)

    # delivery: the webhook job (as `batchfleet webhooks worker` runs it) refuses too,
    # for a URL a submitter with a looser policy let into the queue
    names = Names(NS)
    store = open_result_store(redis_url, names)
    done = Result("r1", "succeeded", model="demo-mlp", generation=1)
    await store.put_pending([("r1", encode_result(Result("r1", "pending", model="demo-mlp")))])
    await store.write_terminal([TerminalWrite("r1", "succeeded", encode_result(done),
                                            generation=1)])
    await store.close()
    receiver = Receiver().start()
    conn = sync_redis.Redis.from_url(redis_url)
    try:
        config = DeliveryConfig("whsec", LENIENT, timeout_s=5, pending_grace_s=0)
        for url in urls:
            with pytest.raises(CallbackRefusedError):
                await asyncio.to_thread(deliver, conn, config, names, "r1", 1, url, "d1")
        # the same job delivers to an allowed address: the refusals were the guard's
        sent = await asyncio.to_thread(deliver, conn, config, names, "r1", 1, receiver.url, "d2")
        assert sent["status_code"] == 200 and len(receiver.deliveries) == 1
    finally:
        conn.close()
        receiver.stop()
