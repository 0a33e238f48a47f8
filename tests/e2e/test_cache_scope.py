"""The result cache is per owner by default (docs/cache.md, "Scope"): over HTTP, key B
sending key A's exact inputs is computed, not answered from A's entry; under
``--cache-scope MODEL=shared`` it is; ``"cache": false`` in a body is honoured; and the
HTTP result says ``cached``. Real Redis, a real ``batchfleet worker`` process, a real
uvicorn gateway."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration
from tests.support.gateway_main import live_gateway

pytestmark = pytest.mark.e2e

NS = "cscope"
A, B = {"X-API-Key": "k-alice"}, {"X-API-Key": "k-bob"}
KEYS = KeyRing.parse(f"alice:{hash_key('k-alice')}:*\nbob:{hash_key('k-bob')}:*")
#: demo-mlp keeps the default scope (owner); "open" is a second model with the shared one.
MODELS = ("demo-mlp", "open=demo-mlp:seed=3")


@pytest.fixture
def worker(redis_url: str) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(redis_url, namespace=NS, models=MODELS, log_level="warning",
                         extra_args=("--cache-ttl-s", "3600", "--cache-scope", "open=shared",
                                     "--no-webhooks"))
    with proc:
        yield proc.wait_ready()


async def _result(http: httpx.AsyncClient, key: dict[str, str], model: str,
                  x: np.ndarray, **fields: Any) -> dict[str, Any]:
    sent = await http.post(f"/v1/models/{model}/requests", headers=key,
                           json={"inputs": x.tolist(), **fields})
    assert sent.status_code == 202, sent.text
    got = await http.get(sent.headers["Location"], params={"wait": 30}, headers=key)
    body: dict[str, Any] = got.json()
    assert got.status_code == 200 and body["status"] == "succeeded", body
    assert isinstance(body["cached"], bool)  # always there, true or false
    return body


def _computed(body: dict[str, Any]) -> bool:
    """What a caller sees of a computed result: a batch, compute time, not ``cached``."""
    return (not body["cached"] and body["batch_size"] is not None
            and body["compute_ms"] > 0 and body["finished_at"] > body["started_at"])


async def test_owners_never_share_entries_unless_the_model_is_shared(
        redis_url: str, worker: WorkerProcess) -> None:
    x = np.random.default_rng(7).random(10, dtype=np.float32) + 1
    y = x + 1
    with live_gateway(GatewaySettings(broker=redis_url, namespace=NS, keys=KEYS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            # owner scope (the default): each key its own entries
            a1 = await _result(http, A, "demo-mlp", x)
            a2 = await _result(http, A, "demo-mlp", x)
            b1 = await _result(http, B, "demo-mlp", x)
            b2 = await _result(http, B, "demo-mlp", x)
            assert _computed(a1) and a2["cached"]  # A's own repeat is a hit
            assert _computed(b1), "B was answered from A's entry"
            assert b2["cached"] and b1["outputs"] == a1["outputs"] == b2["outputs"]
            a3 = await _result(http, A, "demo-mlp", x, cache=False)  # opted out over HTTP
            assert _computed(a3)

            # shared scope: a hit across keys (the documented trade-off)
            s1 = await _result(http, A, "open", y)
            s2 = await _result(http, B, "open", y)
            s3 = await _result(http, B, "open", y, cache=False)
            assert _computed(s1) and s2["cached"] and _computed(s3)
            assert s2["outputs"] == s1["outputs"]

    # the SDK's owner= is the same scope as that API key; ownerless requests share one
    async with AsyncClient(redis_url, namespace=NS) as sdk:
        as_bob = await sdk.wait(await sdk.submit("demo-mlp", x, owner="bob"), timeout=30)
        first = await sdk.wait(await sdk.submit("demo-mlp", x), timeout=30)
        second = await sdk.wait(await sdk.submit("demo-mlp", x), timeout=30)
    assert as_bob.cached and not first.cached and second.cached
    assert worker.alive


async def test_a_cache_field_that_is_not_a_boolean_is_a_422(
        redis_url: str) -> None:
    """``cache`` must be a boolean: anything else is a 422 naming the field."""
    registry = open_model_registry(redis_url, Names(NS))
    await registry.declare("demo-mlp", Declaration(0.0))
    await registry.close()
    with live_gateway(GatewaySettings(broker=redis_url, namespace=NS, keys=KEYS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            odd: list[Any] = ["no", 0, [], {}]
            for value in odd:
                res = await http.post("/v1/models/demo-mlp/requests", headers=A,
                                      json={"inputs": [0.5] * 10, "cache": value})
                assert res.status_code == 422, (value, res.text)
                assert "cache must be" in res.json()["error"]["message"]
            ok = await http.post("/v1/models/demo-mlp/requests", headers=A,
                                 json={"inputs": [0.5] * 10, "cache": False})
            assert ok.status_code == 202, ok.text
