"""Signed webhooks end to end: worker -> RQ queue -> real webhook worker -> real receiver."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.producers import AsyncClient
from batchfleet.producers.signatures import verify_signature
from batchfleet.schemas.errors import CallbackRefusedError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration
from tests.e2e.test_gateway import AUTH, NS, settings
from tests.support.fleet import running_worker
from tests.support.gateway_main import live_gateway
from tests.support.models import non_finite_model
from tests.support.receiver import Receiver

pytestmark = pytest.mark.e2e

SECRET = "whsec-test"
LOOPBACK = CallbackPolicy.parse("http", "", "127.0.0.0/8")


def _cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batchfleet", "webhooks",
                           *args, "--results", redis_url, "--namespace", NS],
                          capture_output=True, text=True, timeout=60, check=True)


@pytest.fixture
def webhook_worker(redis_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """``batchfleet webhooks worker``: allows http and loopback, explicitly (tests only)."""
    env = {**os.environ, "BATCHFLEET_WEBHOOK_SECRET": SECRET,
           "BATCHFLEET_CALLBACK_SCHEMES": "http", "BATCHFLEET_CALLBACK_HOSTS": "127.0.0.1",
           "BATCHFLEET_CALLBACK_ALLOW_NETS": "127.0.0.0/8"}
    proc = subprocess.Popen([sys.executable, "-m", "batchfleet", "webhooks",
                             "worker", "--results", redis_url, "--namespace", NS],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    proc.terminate()
    proc.wait(30)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver()
    yield hook
    hook.stop()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(redis_url, namespace=NS, callback_policy=LOOPBACK) as sdk:
        yield sdk


def _worker(redis_url: str, *intervals: int) -> Any:
    return running_worker(redis_url, namespace=NS, webhook_retry_intervals=intervals)


async def _arrivals(receiver: Receiver, count: int, timeout: float) -> list[Any]:
    got = await asyncio.to_thread(receiver.wait_for, count, timeout)
    assert len(got) >= count, f"{len(got)} of {count} deliveries after {timeout}s"
    return got


async def test_signed_delivery_of_the_stored_result(redis_url: str, webhook_worker: Any,
                                                    receiver: Receiver,
                                                    client: AsyncClient) -> None:
    receiver.start()
    async with _worker(redis_url, 1, 1, 1):
        with live_gateway(settings(redis_url)) as base:
            async with httpx.AsyncClient(base_url=base) as http:
                sent = await http.post("/v1/models/demo-mlp/requests", headers=AUTH, json={
                    "inputs": [0.3] * 10, "callback_url": receiver.url + "?src=http"})
                assert sent.status_code == 202, sent.text
                rid = sent.json()["request_id"]
                polled = (await http.get(f"/v1/requests/{rid}", params={"wait": 20},
                                         headers=AUTH)).json()
        from_sdk = await client.submit("demo-mlp", [0.7] * 10, callback_url=receiver.url)
        plain = await client.submit("demo-mlp", [0.7] * 10)  # no callback: no delivery
        await client.wait_many([from_sdk, plain], timeout=20)
        got = await _arrivals(receiver, 2, 30)
    await asyncio.sleep(1.0)
    assert len(receiver.deliveries) == 2
    by_id = {json.loads(d.body)["request_id"]: d for d in got}
    assert set(by_id) == {rid, from_sdk}
    hit = by_id[rid]
    assert hit.path == "/hook?src=http" and json.loads(hit.body) == polled
    assert hit.headers["Content-Type"] == "application/json"
    assert hit.headers["Batchfleet-Request-Id"] == rid
    assert hit.headers["Batchfleet-Delivery"].startswith(f"{NS}-wh-")
    signature = hit.headers["Batchfleet-Signature"]
    assert verify_signature(SECRET, hit.body, signature)
    assert not verify_signature(SECRET, hit.body.replace(b"succeeded", b"failed"), signature)
    assert not verify_signature("another-secret", hit.body, signature)
    assert not verify_signature(SECRET, hit.body, signature, now=time.time() + 3600)


async def test_a_receiver_down_for_ten_seconds_gets_the_delivery_after(
        redis_url: str, webhook_worker: Any, receiver: Receiver, client: AsyncClient) -> None:
    async with _worker(redis_url, 3, 3, 3, 3, 3, 3, 3):
        rid = await client.submit("demo-mlp", [0.1] * 10, callback_url=receiver.url)
        assert (await client.wait(rid, timeout=20)).status == "succeeded"
        await asyncio.sleep(10)
        assert receiver.deliveries == []
        receiver.start()
        got = await _arrivals(receiver, 1, 20)
    assert json.loads(got[0].body)["request_id"] == rid
    assert verify_signature(SECRET, got[0].body, got[0].headers["Batchfleet-Signature"])


async def test_a_receiver_that_stays_down_lands_in_failed_and_replay_delivers(
        redis_url: str, webhook_worker: Any, receiver: Receiver, client: AsyncClient) -> None:
    async with _worker(redis_url, 1, 1):
        rid = await client.submit("demo-mlp", [0.2] * 10, callback_url=receiver.url)
        await client.wait(rid, timeout=20)
    failed: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while not failed and time.monotonic() < deadline:
        await asyncio.sleep(1)
        failed = json.loads(_cli(redis_url, "failed", "--json").stdout)
    assert [f["request_id"] for f in failed] == [rid]
    assert "WebhookDeliveryError" in failed[0]["error"]
    receiver.start()
    assert "replayed 1 of 1" in _cli(redis_url, "replay", "--all").stdout
    got = await _arrivals(receiver, 1, 20)
    assert got[0].headers["Batchfleet-Delivery"] == failed[0]["delivery_id"]
    assert json.loads(_cli(redis_url, "failed", "--json").stdout) == []


async def test_callback_urls_outside_the_allowlist_are_refused(
        redis_url: str, webhook_worker: Any, receiver: Receiver) -> None:
    async with AsyncClient(redis_url, namespace=NS, check_model=False) as strict:
        for url in ["http://example.com/hook", "https://127.0.0.1/hook", "https://10.1.2.3/",
                    "https://169.254.169.254/latest/meta-data", "https://localhost/x",
                    "https://[::1]/x", "https://user:pw@example.com/", "file:///etc/passwd",
                    "https://2130706433/", "https://0x7f000001/", "https://0177.0.0.1/",
                    "https://127.1/", "https://0/", "https://[64:ff9b::a00:5]/",
                    "https://[2002:a9fe:a9fe::]/"]:
            with pytest.raises(CallbackRefusedError):
                await strict.submit("demo-mlp", [0.0] * 10, callback_url=url)
    # declared, so the gateway gets past the model check to the callback check
    registry = open_model_registry(redis_url, Names(NS))
    await registry.declare("demo-mlp", Declaration(0.0))
    await registry.close()
    with live_gateway(settings(redis_url, callback_policy=CallbackPolicy())) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            for url in ["https://192.168.1.1/hook", "https://2130706433/hook",
                        "https://[64:ff9b::a00:5]/hook"]:
                res = await http.post("/v1/models/demo-mlp/requests", headers=AUTH, json={
                    "inputs": [0.0] * 10, "callback_url": url})
                assert res.status_code == 422, (url, res.text)
                assert res.json()["error"]["type"] == "callback_refused"

    # The webhook worker checks again at delivery: it allows only host 127.0.0.1, so a
    # URL the (more lenient) submitter let through fails at once, without retries.
    receiver.start()
    async with _worker(redis_url, 1, 1, 1, 1, 1, 1), \
            AsyncClient(redis_url, namespace=NS, callback_policy=LOOPBACK) as lenient:
        rid = await lenient.submit("demo-mlp", [0.0] * 10,
                                   callback_url=f"http://127.0.0.2:{receiver.port}/hook")
        await lenient.wait(rid, timeout=20)
        failed: list[dict[str, Any]] = []
        for _ in range(20):
            failed = json.loads(_cli(redis_url, "failed", "--json").stdout)
            if failed:
                break
            await asyncio.sleep(0.5)
    assert [f["request_id"] for f in failed] == [rid]
    assert "CallbackRefusedError" in failed[0]["error"]
    assert receiver.deliveries == []


async def test_the_job_sends_only_the_stored_terminal_result(redis_url: str,
                                                            receiver: Receiver) -> None:
    """deliver() against real Redis: pending waits then retries, newer generations skip,
    a vanished record gives up; the body is always the store's, never the job's."""
    import redis as sync_redis

    from batchfleet.connectors.result_store import TerminalWrite
    from batchfleet.connectors.webhook_jobs import DeliveryConfig, deliver
    from batchfleet.schemas.envelopes import Result, encode_result
    from batchfleet.schemas.errors import WebhookDeliveryError
    from batchfleet.schemas.names import Names
    from tests.support.seams import open_result_store

    names = Names(NS)
    store = open_result_store(redis_url, names)
    await store.put_pending([("r1", encode_result(Result("r1", "pending", model="demo-mlp")))])
    conn = sync_redis.Redis.from_url(redis_url)
    config = DeliveryConfig(SECRET, LOOPBACK, timeout_s=5, pending_grace_s=0.2)
    receiver.start()
    started = time.monotonic()
    with pytest.raises(WebhookDeliveryError, match="not written yet"):
        await asyncio.to_thread(deliver, conn, config, names, "r1", 0, receiver.url, "d1")
    assert 0.2 <= time.monotonic() - started < 2
    await store.write_terminal([TerminalWrite("r1", "failed", encode_result(
        Result("r1", "failed", model="demo-mlp", generation=1)), generation=1)])
    skipped = await asyncio.to_thread(deliver, conn, config, names, "r1", 0, receiver.url, "d1")
    assert "superseded" in skipped["skipped"]
    sent = await asyncio.to_thread(deliver, conn, config, names, "r1", 1, receiver.url, "d2")
    assert sent == {"status_code": 200, "delivery_id": "d2"}
    assert json.loads(receiver.deliveries[0].body)["status"] == "failed"
    with pytest.raises(WebhookDeliveryError, match="gone"):
        await asyncio.to_thread(deliver, conn, config, names, "never", 0, receiver.url, "d3")
    conn.close()
    await store.close()


def _strict_json(body: bytes) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"non-JSON constant {constant} in body")
    return json.loads(body, parse_constant=refuse)


async def test_non_finite_outputs_are_null_in_the_webhook_and_get_bodies_alike(
        redis_url: str, webhook_worker: Any, receiver: Receiver) -> None:
    """A model turning finite inputs into NaN and Infinity: both bodies are strict JSON with
    ``null`` in those places, and they are the same bytes (one encoder serves both)."""
    receiver.start()
    async with running_worker(redis_url, namespace=NS, webhook_retry_intervals=(1, 1, 1),
                              handlers={"nan-out": non_finite_model()}):
        with live_gateway(settings(redis_url)) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                sent = await http.post("/v1/models/nan-out/requests", headers=AUTH, json={
                    "inputs": [0.5] * 10, "callback_url": receiver.url})
                assert sent.status_code == 202, sent.text
                rid = sent.json()["request_id"]
                polled = await http.get(f"/v1/requests/{rid}", params={"wait": 20},
                                        headers=AUTH)
        got = await _arrivals(receiver, 1, 30)
    body = _strict_json(got[0].body)
    assert body["status"] == "succeeded" and body["request_id"] == rid
    assert body["outputs"] == [None, None, None, 0.5]
    assert polled.headers["content-type"] == "application/json"
    assert _strict_json(polled.content) == body
    assert got[0].body == polled.content
    assert verify_signature(SECRET, got[0].body, got[0].headers["Batchfleet-Signature"])


async def test_a_trailing_newline_is_refused_in_ids_and_model_names(redis_url: str) -> None:
    """Reproduction: ``wf-nl\\n`` used to be accepted and readable at ``/v1/requests/wf-nl%0A``."""
    import redis.asyncio as aioredis

    from batchfleet.schemas.errors import ValidationError
    from batchfleet.schemas.names import Names

    async with AsyncClient(redis_url, namespace=NS, check_model=False) as sdk:
        for rid, model in [("wf-nl\n", "demo-mlp"), ("wf-nl", "demo-mlp\n")]:
            with pytest.raises(ValidationError):
                await sdk.submit(model, [0.0] * 10, request_id=rid)
    conn = aioredis.Redis.from_url(redis_url)
    assert await conn.exists(Names(NS).result("wf-nl\n"), Names(NS).result("wf-nl")) == 0
    await conn.aclose()
    with live_gateway(settings(redis_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            got = await http.get("/v1/requests/wf-nl%0A", headers=AUTH)
            sent = await http.post("/v1/models/demo-mlp%0A/requests", headers=AUTH,
                                   json={"inputs": [0.0] * 10})
    assert got.status_code == 404, got.text
    assert sent.status_code in (404, 422), sent.text
