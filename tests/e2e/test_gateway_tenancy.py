"""Tenancy at the gateway: results owned by their key, unguessable derived IDs, idempotency
scoped to key, model and body, per-key quotas shared by replicas, and a pool that waits.

Real uvicorn, real Redis; a worker only where a result must become terminal."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from batchfleet.connectors import SubmitState, TerminalWrite
from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.quotas import Quota, QuotaGate
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.values import Ownership
from batchfleet.producers import AsyncClient
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration
from tests.support.fleet import running_worker
from tests.support.gateway_main import gateway_process, live_gateway
from tests.support.seams import open_result_store

pytestmark = pytest.mark.e2e

NS = "gwten"
SECRET = "test-secret-0123456789abcdef"
KEYS_TEXT = "\n".join([
    f"bill:{hash_key('k-bill')}:*",
    f"billing:{hash_key('k-billing')}:*",
    f"root:{hash_key('k-root')}:*:scopes=admin",
    f"rl:{hash_key('k-rl')}:demo-mlp:rate=50 burst=100",
    f"fl:{hash_key('k-fl')}:demo-mlp:in_flight=3",
])
BILL, BILLING, ROOT = ({"X-API-Key": k} for k in ("k-bill", "k-billing", "k-root"))
RL, FL = {"X-API-Key": "k-rl"}, {"X-API-Key": "k-fl"}
X = {"inputs": [0.25] * 10}


def _settings(redis_url: str, **overrides: Any) -> GatewaySettings:
    return GatewaySettings(broker=redis_url, namespace=NS, keys=KeyRing.parse(KEYS_TEXT),
                           callback_policy=CallbackPolicy.parse("http,https", "", "127.0.0.0/8"),
                           id_secret=SECRET, **overrides)


async def _register(redis_url: str, *models: str) -> None:
    """Declared ahead of workers: submits to these models are accepted with no worker."""
    registry = open_model_registry(redis_url, Names(NS))
    for model in models:
        await registry.declare(model, Declaration(0.0))
    await registry.close()


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    with live_gateway(_settings(redis_url, redis_max_connections=20)) as base:
        yield base


@pytest.fixture
async def http(gateway: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    await _register(redis_url, "demo-mlp", "demo-encoder")
    async with httpx.AsyncClient(base_url=gateway, timeout=60) as client:
        yield client


REPLICA_ENV = {"BATCHFLEET_GATEWAY_ID_SECRET": SECRET, "BATCHFLEET_NAMESPACE": NS,
               "BATCHFLEET_GATEWAY_REDIS_MAX_CONNECTIONS": "20"}


@pytest.fixture
async def replica(redis_url: str) -> AsyncIterator[str]:
    """A gateway in its own process (load tests: the test's client gets a core of its own),
    with pools of 20 connections, so a thousand callers must wait for one."""
    await _register(redis_url, "demo-mlp")
    with gateway_process(redis_url, KEYS_TEXT, **REPLICA_ENV) as base:
        yield base


def _same_404(a: httpx.Response, b: httpx.Response, a_id: str, b_id: str) -> None:
    """Another key's request and a made-up ID get the same answer, byte for byte but the ID."""
    assert a.status_code == b.status_code == 404
    assert a.text.replace(a_id, "ID") == b.text.replace(b_id, "ID")
    assert dict(a.headers) | {"content-length": ""} == dict(b.headers) | {"content-length": ""}


async def test_results_are_readable_only_by_their_key_or_an_admin(
        http: httpx.AsyncClient, redis_url: str) -> None:
    async with running_worker(redis_url, namespace=NS, models=("demo-mlp",), webhooks=False):
        sent = await http.post("/v1/models/demo-mlp/requests", json=X,
                               headers={**BILL, "Idempotency-Key": "invoice-7"})
        assert sent.status_code == 202, sent.text
        rid = sent.json()["request_id"]
        own = await http.get(f"/v1/requests/{rid}", params={"wait": 20}, headers=BILL)
        assert own.status_code == 200 and own.json()["status"] == "succeeded"

        # What "billing" could compute before: sha256 of the key ID and the idempotency key.
        computed = "gw-" + hashlib.sha256(b"bill\0invoice-7").hexdigest()[:40]
        assert computed != rid
        guessed = await http.get(f"/v1/requests/{computed}", headers=BILLING)
        stolen = await http.get(f"/v1/requests/{rid}", params={"wait": 1}, headers=BILLING)
        made_up = await http.get("/v1/requests/gw-" + "0" * 40, headers=BILLING)
        _same_404(stolen, made_up, rid, "gw-" + "0" * 40)
        _same_404(guessed, made_up, computed, "gw-" + "0" * 40)
        admin = await http.get(f"/v1/requests/{rid}", headers=ROOT)
        assert admin.status_code == 200 and admin.json() == own.json()

        async with AsyncClient(redis_url, namespace=NS) as sdk:
            ownerless = await sdk.submit("demo-mlp", X["inputs"])
            owned = await sdk.submit("demo-mlp", X["inputs"], owner="bill")
            await sdk.wait_many([ownerless, owned], timeout=20)
        assert (await http.get(f"/v1/requests/{ownerless}", headers=BILL)).status_code == 404
        assert (await http.get(f"/v1/requests/{ownerless}", headers=ROOT)).status_code == 200
        assert (await http.get(f"/v1/requests/{owned}", headers=BILL)).status_code == 200
        assert (await http.get(f"/v1/requests/{owned}", headers=BILLING)).status_code == 404


async def test_idempotency_is_scoped_to_key_model_and_body(http: httpx.AsyncClient,
                                                            redis_url: str) -> None:
    url = "/v1/models/{}/requests"
    idem = {**BILL, "Idempotency-Key": "order-9"}
    first = await http.post(url.format("demo-mlp"), json=X, headers=idem)
    again = await http.post(url.format("demo-mlp"), json=X, headers=idem)
    other_model = await http.post(url.format("demo-encoder"), json=X, headers=idem)
    other_body = await http.post(url.format("demo-mlp"), json={"inputs": [0.5] * 10},
                                 headers=idem)
    other_key = await http.post(url.format("demo-mlp"), json=X,
                                headers={**BILLING, "Idempotency-Key": "order-9"})
    assert first.status_code == again.status_code == other_key.status_code == 202
    assert again.json()["request_id"] == first.json()["request_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other_key.json()["request_id"] != first.json()["request_id"]
    for refused in (other_model, other_body):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["type"] == "idempotency_conflict"
        assert "another model or another body" in refused.json()["error"]["message"]

    batch = {**BILL, "Idempotency-Key": "nightly-9"}
    b1 = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [X["inputs"]] * 2},
                         headers=batch)
    b2 = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [X["inputs"]] * 2},
                         headers=batch)
    b3 = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [X["inputs"]] * 3},
                         headers=batch)
    assert b1.json()["request_ids"] == b2.json()["request_ids"] and b3.status_code == 409
    # Nothing was enqueued for the refusals: one message per accepted request.
    redis = redis_client(redis_url)
    assert await redis.xlen(Names(NS).stream("demo-mlp", "interactive")) == 2 + 2
    # Without an Idempotency-Key the gateway makes the IDs: none is fingerprinted (review 3).
    plain = await http.post(url.format("demo-mlp"), json=X, headers=BILL)
    plain_batch = await http.post("/v1/models/demo-mlp/batches",
                                  json={"inputs": [X["inputs"]] * 2}, headers=BILL)
    made = [plain.json()["request_id"], *plain_batch.json()["request_ids"]]
    fps = [await redis.hget(Names(NS).result(rid), "fp")
           for rid in [*made, first.json()["request_id"]]]
    assert fps[:3] == [None, None, None] and fps[3] is not None
    await redis.aclose()


async def test_a_thousand_concurrent_long_polls_wait_for_connections(replica: str) -> None:
    async with httpx.AsyncClient(base_url=replica, timeout=60) as http:
        rid = (await http.post("/v1/models/demo-mlp/requests", json=X, headers=BILL)
               ).json()["request_id"]
    # One connection per poll, none reused: all thousand are held at the gateway at once.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=replica, timeout=60, limits=limits) as many:
        polls = await asyncio.gather(*(
            many.get(f"/v1/requests/{rid}", params={"wait": 0.5}, headers=BILL)
            for _ in range(1000)))
    codes = [r.status_code for r in polls]
    assert codes.count(200) == 1000, {c: codes.count(c) for c in set(codes)}
    assert all(r.json()["status"] == "pending" for r in polls)


async def _flood(bases: list[str], headers: dict[str, str], rate: float, seconds: float
                 ) -> tuple[list[httpx.Response], float]:
    """Aim ``rate`` submits per second for ``seconds`` (alternating between gateways); the
    responses and the time from the first request written to the last."""
    sent: list[float] = []

    async def note(event: str, _: Any) -> None:  # the request is written on a connection
        if event == "http11.send_request_body.complete":
            sent.append(time.monotonic())

    # A few kept-alive connections each: new connections would cost more than the requests.
    clients = [httpx.AsyncClient(base_url=base, timeout=60,
                                 limits=httpx.Limits(max_connections=8)) for base in bases]
    body, headers = json.dumps(X).encode(), {**headers, "Content-Type": "application/json"}
    tasks = []
    start = time.monotonic()
    try:
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.ensure_future(clients[i % len(clients)].post(
                "/v1/models/demo-mlp/requests", content=body, headers=headers,
                extensions={"trace": note})))
        responses = list(await asyncio.gather(*tasks))
    finally:
        for client in clients:
            await client.aclose()
    return responses, max(sent) - min(sent)


def _check_throttled(responses: list[httpx.Response], burst: int, rate: float,
                     elapsed: float) -> int:
    accepted = [r for r in responses if r.status_code == 202]
    refused = [r for r in responses if r.status_code == 429]
    assert len(accepted) + len(refused) == len(responses), {r.status_code for r in responses}
    # A token bucket admits the burst plus the rate over the span; a sender on a machine too
    # busy to offer more than the rate is simply never throttled, which is also correct.
    expected = min(float(len(responses)), burst + rate * elapsed)
    assert abs(len(accepted) - expected) <= 0.1 * expected, (
        f"{len(accepted)} accepted, expected {expected:.0f}: {len(responses)} sent in "
        f"{elapsed:.2f}s")
    if len(responses) <= 1.1 * (burst + rate * elapsed):
        return len(accepted)  # never over the limit: nothing to refuse
    no = refused[0]
    assert no.json()["error"]["type"] == "quota_exceeded" and no.json()["error"]["retryable"]
    assert int(no.headers["Retry-After"]) >= 1
    assert no.headers["RateLimit-Limit"] == str(burst)
    assert int(no.headers["RateLimit-Remaining"]) == 0 and int(no.headers["RateLimit-Reset"]) >= 1
    assert accepted[0].headers["RateLimit-Limit"] == str(burst)
    return len(accepted)


async def test_rate_limit_admits_burst_plus_rate(replica: str, redis_url: str) -> None:
    responses, elapsed = await _flood([replica], RL, rate=200, seconds=3)
    accepted = _check_throttled(responses, burst=100, rate=50, elapsed=elapsed)
    redis = redis_client(redis_url)
    assert await redis.xlen(Names(NS).stream("demo-mlp", "interactive")) == accepted
    await redis.aclose()
    async with httpx.AsyncClient(base_url=replica) as http:
        metrics = (await http.get("/metrics")).text
    assert f'batchfleet_gateway_accepted_total{{key="rl"}} {accepted}.0' in metrics
    assert (f'batchfleet_gateway_throttled_total{{key="rl",limit="rate"}} '
            f'{len(responses) - accepted}.0') in metrics


async def test_two_replicas_share_one_budget(redis_url: str) -> None:
    await _register(redis_url, "demo-mlp")
    with gateway_process(redis_url, KEYS_TEXT, **REPLICA_ENV) as a, \
            gateway_process(redis_url, KEYS_TEXT, **REPLICA_ENV) as b:
        responses, elapsed = await _flood([a, b], RL, rate=200, seconds=3)
    accepted = _check_throttled(responses, burst=100, rate=50, elapsed=elapsed)
    if accepted < len(responses):  # over the limit: each replica admitted some, refused some
        for half in (responses[0::2], responses[1::2]):
            assert {r.status_code for r in half} == {202, 429}


async def test_in_flight_limit_frees_on_terminal_results_only(http: httpx.AsyncClient,
                                                             redis_url: str) -> None:
    """Issue 23 #8: a passed deadline does not free a slot (the request is not terminal
    until a worker answers it ``expired``), so short deadlines cannot get a key past its
    limit; the terminal results, ``expired`` ones included, free the slots."""
    url = "/v1/models/demo-mlp/requests"
    held = [await http.post(url, json=X, headers=FL) for _ in range(2)]
    short = await http.post(url, json={**X, "deadline_s": 1}, headers=FL)
    assert [r.status_code for r in [*held, short]] == [202] * 3
    over = await http.post(url, json=X, headers=FL)
    assert over.status_code == 429 and over.headers["RateLimit-Limit"] == "3"
    assert over.headers["RateLimit-Remaining"] == "0" and over.headers["Retry-After"] == "1"
    too_big = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [X["inputs"]] * 4},
                              headers=FL)
    assert too_big.status_code == 413, too_big.text

    # short deadlines, sent until well past them: with no worker, nothing became terminal
    tries = []
    for _ in range(12):
        tries.append(await http.post(url, json={**X, "deadline_s": 0.01}, headers=FL))
        await asyncio.sleep(0.15)
    assert [r.status_code for r in tries] == [429] * 12
    store = open_result_store(redis_url, Names(NS))
    ids = [r.json()["request_id"] for r in [*held, short]]
    assert [rec is not None and rec.status == "pending"
            for rec in await store.get_records(ids)] == [True] * 3
    await store.close()
    two = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [X["inputs"]] * 2},
                          headers=FL)
    assert two.status_code == 429  # a batch counts its size

    async with running_worker(redis_url, namespace=NS, models=("demo-mlp",), webhooks=False):
        statuses = []
        for sent in [*held, short]:
            done = await http.get(sent.headers["Location"], params={"wait": 20}, headers=FL)
            statuses.append(done.json()["status"])
        assert statuses == ["succeeded", "succeeded", "expired"]
        again = await http.post("/v1/models/demo-mlp/batches",
                                json={"inputs": [X["inputs"]] * 3}, headers=FL)
        assert again.status_code == 202, again.text


async def test_store_refuses_another_fingerprint_and_frees_slots_on_terminal_write(
        redis_url: str) -> None:
    """The two store-side halves: a racing idempotent submit with another body is never
    published (state CONFLICT), and a terminal write frees its owner's in-flight slot."""
    store = open_result_store(redis_url, Names(NS))
    gate = QuotaGate(store.redis, Names(NS))
    quota = Quota(max_in_flight=1)
    try:
        assert (await gate.admit("bill", quota, ["r1"])).allowed
        first = await store.put_pending([("r1", b"p")], [Ownership("bill", "fp-a")])
        same = await store.put_pending([("r1", b"p")], [Ownership("bill", "fp-a")])
        other = await store.put_pending([("r1", b"p")], [Ownership("bill", "fp-b")])
        assert (first, same, other) == ([SubmitState.NEW], [SubmitState.PENDING],
                                        [SubmitState.CONFLICT])
        assert not (await gate.admit("bill", quota, ["r2"])).allowed
        record = (await store.get_records(["r1"]))[0]
        assert record is not None and (record.owner, record.fingerprint) == ("bill", "fp-a")
        assert await store.write_terminal([TerminalWrite("r1", "succeeded", b"done")]) == [True]
        assert (await gate.admit("bill", quota, ["r2"])).allowed
    finally:
        await store.close()
