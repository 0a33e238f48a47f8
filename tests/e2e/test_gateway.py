"""The HTTP gateway against a real uvicorn server, a real in-process worker and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
import torch

from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.producers import AsyncClient
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from batchfleet.schemas.tensors import encode_tensor
from batchfleet.workers import Worker
from batchfleet.workers.models import build_encoder, build_mlp
from tests.support.fleet import running_worker
from tests.support.gateway_main import live_gateway

pytestmark = pytest.mark.e2e

NS = "gwt"
KEY_ALL, KEY_MLP = "bfk_test_all", "bfk_test_mlp"
KEYS = KeyRing.parse(f"all:{hash_key(KEY_ALL)}:*\nmlp:{hash_key(KEY_MLP)}:demo-mlp")
AUTH = {"X-API-Key": KEY_ALL}


def settings(redis_url: str, **overrides: Any) -> GatewaySettings:
    base = GatewaySettings(broker=redis_url, namespace=NS, keys=KEYS,
                           callback_policy=CallbackPolicy.parse("http,https", "", "127.0.0.0/8"))
    return GatewaySettings(**{**{f: getattr(base, f) for f in base.__slots__}, **overrides})


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    with live_gateway(settings(redis_url, max_body_bytes=16 * 1024)) as base:
        yield base


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as client:
        yield client


@pytest.fixture
async def worker(redis_url: str) -> AsyncIterator[Worker]:
    async with running_worker(redis_url, namespace=NS, models=("demo-mlp", "demo-encoder"),
                              webhooks=False) as w:
        yield w


def _local(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(x[None])).numpy()[0]  # type: ignore[no-any-return]


async def test_submit_poll_and_long_poll_both_models(http: httpx.AsyncClient,
                                                      worker: Worker) -> None:
    x = np.linspace(0, 1, 10, dtype=np.float32)
    tokens = np.arange(64, dtype=np.int64) * 7 % 1024
    sent = await http.post("/v1/models/demo-mlp/requests", json={"inputs": x.tolist()},
                           headers=AUTH)
    assert sent.status_code == 202, sent.text
    rid = sent.json()["request_id"]
    assert sent.headers["Location"] == f"/v1/requests/{rid}" == sent.json()["location"]
    polled = await http.get(sent.headers["Location"], headers=AUTH)
    assert polled.status_code == 200 and polled.json()["status"] in {"pending", "succeeded"}

    started = time.monotonic()
    done = (await http.get(f"/v1/requests/{rid}", params={"wait": 20}, headers=AUTH)).json()
    assert done["status"] == "succeeded" and time.monotonic() - started < 10
    np.testing.assert_allclose(done["outputs"], _local(build_mlp(), x), rtol=1e-5, atol=1e-6)
    assert done["model"] == "demo-mlp" and done["model_version"].startswith("default/sha256:")

    enc = await http.post("/v1/models/demo-encoder/requests",
                          json={"inputs": tokens.tolist(), "deadline_s": 60}, headers=AUTH)
    assert enc.status_code == 202, enc.text
    res = (await http.get(enc.headers["Location"], params={"wait": 30}, headers=AUTH)).json()
    assert res["status"] == "succeeded", res
    np.testing.assert_allclose(res["outputs"], _local(build_encoder(), tokens),
                               rtol=1e-4, atol=1e-5)

    # msgpack, with the wire's tensor encoding, and a batch of three
    packed = msgpack.packb({"inputs": encode_tensor(x)}, use_bin_type=True)
    mp = await http.post("/v1/models/demo-mlp/requests", content=packed,
                         headers={**AUTH, "Content-Type": "application/msgpack"})
    assert mp.status_code == 202, mp.text
    batch = await http.post("/v1/models/demo-mlp/batches", headers=AUTH,
                            json={"inputs": [x.tolist()] * 3, "priority": "bulk"})
    assert batch.status_code == 202, batch.text
    for rid in [mp.json()["request_id"], *batch.json()["request_ids"]]:
        out = (await http.get(f"/v1/requests/{rid}", params={"wait": 20}, headers=AUTH)).json()
        np.testing.assert_allclose(out["outputs"], done["outputs"], rtol=1e-5)


async def test_sdk_and_gateway_wait_for_each_other(http: httpx.AsyncClient, worker: Worker,
                                                    redis_url: str) -> None:
    x = [0.5] * 10
    async with AsyncClient(redis_url, namespace=NS) as sdk:
        over_http = (await http.post("/v1/models/demo-mlp/requests", json={"inputs": x},
                                     headers=AUTH)).json()["request_id"]
        assert (await sdk.wait(over_http, timeout=20)).status == "succeeded"
        from_sdk = await sdk.submit("demo-mlp", x, owner="all")  # readable by key "all"
        res = await http.get(f"/v1/requests/{from_sdk}", params={"wait": 20}, headers=AUTH)
        assert res.json()["status"] == "succeeded"


async def test_idempotency_key_returns_the_same_request(http: httpx.AsyncClient,
                                                         worker: Worker) -> None:
    body = {"inputs": [0.1] * 10}
    first = await http.post("/v1/models/demo-mlp/requests", json=body,
                            headers={**AUTH, "Idempotency-Key": "order-42"})
    again = await http.post("/v1/models/demo-mlp/requests", json=body,
                            headers={**AUTH, "Idempotency-Key": "order-42"})
    other = await http.post("/v1/models/demo-mlp/requests", json=body,
                            headers={**AUTH, "Idempotency-Key": "order-43"})
    by_other_key = await http.post("/v1/models/demo-mlp/requests", json=body,
                                   headers={"X-API-Key": KEY_MLP, "Idempotency-Key": "order-42"})
    rid = first.json()["request_id"]
    assert again.status_code == 202 and again.json()["request_id"] == rid
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert len({rid, other.json()["request_id"], by_other_key.json()["request_id"]}) == 3
    done = (await http.get(f"/v1/requests/{rid}", params={"wait": 20}, headers=AUTH)).json()
    late = await http.post("/v1/models/demo-mlp/requests", json=body,
                           headers={**AUTH, "Idempotency-Key": "order-42"})
    assert late.json()["request_id"] == rid
    assert late.json()["status"] == done["status"] == "succeeded"  # where it is now
    await asyncio.sleep(0.3)
    assert (await http.get(f"/v1/requests/{rid}", headers=AUTH)).json() == done
    assert worker.stats.succeeded == 3  # order-42 ran once, under both keys' own IDs

    b1 = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [[0.2] * 10] * 2},
                         headers={**AUTH, "Idempotency-Key": "nightly-1"})
    b2 = await http.post("/v1/models/demo-mlp/batches", json={"inputs": [[0.2] * 10] * 2},
                         headers={**AUTH, "Idempotency-Key": "nightly-1"})
    assert b1.json()["request_ids"] == b2.json()["request_ids"]
    assert len(set(b1.json()["request_ids"])) == 2


async def test_auth_failures_are_refused_and_leave_nothing_behind(
        http: httpx.AsyncClient, redis_url: str) -> None:
    redis = redis_client(redis_url)
    before = sorted(await redis.keys("*"))
    body = {"inputs": [0.0] * 10}
    cases = [
        ("post", "/v1/models/demo-mlp/requests", {}, 401, "unauthorized"),
        ("post", "/v1/models/demo-mlp/requests", {"X-API-Key": "nope"}, 401, "unauthorized"),
        ("post", "/v1/models/demo-encoder/requests", {"X-API-Key": KEY_MLP}, 403, "forbidden"),
        ("post", "/v1/models/demo-encoder/batches", {"X-API-Key": KEY_MLP}, 403, "forbidden"),
        ("get", "/v1/requests/abc", {}, 401, "unauthorized"),
        ("get", "/v1/requests/abc", {"X-API-Key": KEY_ALL + "x"}, 401, "unauthorized"),
    ]
    for method, path, headers, status, kind in cases:
        kwargs: dict[str, Any] = {"json": body} if method == "post" else {}
        res = await http.request(method, path, headers=headers, **kwargs)
        assert res.status_code == status, (path, res.text)
        assert res.json()["error"]["type"] == kind and res.json()["error"]["message"]
    assert sorted(await redis.keys("*")) == before
    await redis.aclose()


async def test_bad_bodies_get_clear_4xx_errors_in_one_shape(http: httpx.AsyncClient,
                                                             worker: Worker) -> None:
    url = "/v1/models/demo-mlp/requests"
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"json": {"inputs": [0.0] * 5000}}, 413, "limit_exceeded"),
        ({"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
         "decode_error"),
        ({"content": b"\xc1\xc1", "headers": {"Content-Type": "application/msgpack"}}, 400,
         "decode_error"),
        ({"content": b"x=1", "headers": {"Content-Type": "text/plain"}}, 415,
         "unsupported_media_type"),
        ({"json": [1, 2]}, 422, "validation_error"),
        ({"json": {"input": [0.0] * 10}}, 422, "validation_error"),
        ({"json": {"inputs": [[1, 2], [3]]}}, 422, "validation_error"),
        ({"json": {"inputs": ["a"] * 10}}, 422, "validation_error"),
        ({"json": {"inputs": [0.0] * 10, "priority": "urgent"}}, 422, "validation_error"),
        ({"json": {"inputs": [0.0] * 10, "deadline_s": -1}}, 422, "validation_error"),
        ({"json": {"inputs": [0.0] * 10, "dtype": "complex128"}}, 422, "validation_error"),
        ({"json": {"inputs": [0.0] * 10, "callback_url": "ftp://x.example/"}}, 422,
         "callback_refused"),
    ]
    for kwargs, status, kind in cases:
        res = await http.post(url, **{"headers": AUTH, **kwargs,
                                      **({"headers": {**AUTH, **kwargs["headers"]}}
                                         if "headers" in kwargs else {})})
        assert res.status_code == status, (kwargs, res.text)
        assert res.json()["error"]["type"] == kind, res.text
        assert set(res.json()["error"]) == {"type", "message", "retryable"}
    unknown = await http.post("/v1/models/no-such-model/requests", json={"inputs": [1.0]},
                              headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "unknown_model"
    missing = await http.get("/v1/requests/never-submitted", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    bad_wait = await http.get("/v1/requests/x", params={"wait": "soon"}, headers=AUTH)
    assert bad_wait.status_code == 422 and bad_wait.json()["error"]["type"] == "validation_error"
    nowhere = await http.get("/v2/nothing")
    assert nowhere.status_code == 404 and nowhere.json()["error"]["type"] == "not_found"


async def test_health_readiness_metrics_and_openapi(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await http.get("/readyz")).json() == {
        "status": "ready", "eviction_policy": "noeviction", "eviction_policy_safe": True}
    await http.get("/v1/requests/x", headers=AUTH)
    metrics = (await http.get("/metrics")).text
    assert 'batchfleet_gateway_requests_total{method="GET",route="/v1/requests/{request_id}"' \
           in metrics
    spec = (await http.get("/openapi.json")).json()
    assert {"/v1/models/{model}/requests", "/v1/models/{model}/batches",
            "/v1/requests/{request_id}"} <= set(spec["paths"])
    assert "APIKeyHeader" in spec["components"]["securitySchemes"]


async def test_a_pipeline_is_submitted_like_a_model_and_its_result_has_steps(
        http: httpx.AsyncClient, worker: Worker, redis_url: str) -> None:
    """POST /v1/models/{pipeline}/requests (issue 29): the result comes back under the
    request ID the gateway gave, with ``steps``."""
    from batchfleet.connectors.redis_plane import open_redis_control_plane
    from batchfleet.schemas.pipeline import from_steps

    plane = open_redis_control_plane(redis_url, namespace=NS)
    try:
        await plane.pipelines.declare(from_steps("tok-enc", "demo-encoder"))
    finally:
        await plane.close()
    tokens = np.arange(64, dtype=np.int64) * 5 % 1024
    sent = await http.post("/v1/models/tok-enc/requests",
                           json={"inputs": tokens.tolist(), "dtype": "int64"}, headers=AUTH)
    assert sent.status_code == 202, sent.text
    rid = sent.json()["request_id"]
    done = (await http.get(f"/v1/requests/{rid}", params={"wait": 30}, headers=AUTH)).json()
    assert done["status"] == "succeeded" and done["model"] == "tok-enc", done
    assert [s["step"] for s in done["steps"]] == ["demo-encoder"]
    np.testing.assert_allclose(done["outputs"], _local(build_encoder(), tokens),
                               rtol=1e-4, atol=1e-5)
