"""Metrics and health endpoints of a real worker under load."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.producers import AsyncClient
from tests.support.fleet import running_worker
from tests.support.models import Switchable, switchable

pytestmark = pytest.mark.e2e


def _value(metrics: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()) and \
                re.match(rf"^{re.escape(name)}(\{{|$)", head):
            total += float(value)
    return total


async def test_metrics_move_under_load(redis_url: str) -> None:
    async with running_worker(redis_url, metrics_port=0, sample_every_s=0.2) as worker, \
            AsyncClient(redis_url) as client, httpx.AsyncClient() as http:
        base = f"http://127.0.0.1:{worker.health_port}"
        before = (await http.get(f"{base}/metrics")).text
        ids = await client.submit_many("demo-mlp", np.random.rand(3000, 10).astype(np.float32))
        await client.wait_many(ids, timeout=60)
        await client.submit("demo-mlp", np.zeros(3, np.float32))  # a validation failure
        await asyncio.sleep(0.5)
        after = (await http.get(f"{base}/metrics")).text
    done = "batchfleet_requests_total"
    assert _value(before, done) == 0
    assert _value(after, done, model="demo-mlp", lane="interactive", status="succeeded") == 3000
    assert _value(after, done, status="failed") == 1
    assert _value(after, "batchfleet_batch_size_count", model="demo-mlp") > 0
    assert _value(after, "batchfleet_batch_size_sum") == 3000
    assert _value(after, "batchfleet_end_to_end_seconds_count") == 3001
    assert _value(after, "batchfleet_model_load_seconds", model="demo-mlp") > 0
    assert _value(after, "batchfleet_backlog", model="demo-mlp", lane="interactive") == 0
    assert "batchfleet_breaker_state" in after and "batchfleet_dlq_size" in after


async def test_readyz_flips_when_redis_stops_and_when_the_breaker_opens(
        redis_server: EmbeddedRedis) -> None:
    model = Switchable()
    async with running_worker(redis_server.url, handlers={"switch": switchable(model)},
                              metrics_port=0, breaker_failures=2, breaker_cooldown_s=30,
                              max_attempts=10, retry_base_s=0.01, retry_cap_s=0.02) as worker, \
            httpx.AsyncClient() as http:
        base = f"http://127.0.0.1:{worker.health_port}"
        assert (await http.get(f"{base}/healthz")).status_code == 200
        ready = await http.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        # the model starts failing: two failed batches open the breaker
        model.broken = True
        async with AsyncClient(redis_server.url) as client:
            await client.submit_many("switch", np.random.rand(4, 10).astype(np.float32))
            for _ in range(100):
                if worker.guards.model.trips:
                    break
                await asyncio.sleep(0.05)
        not_ready = await http.get(f"{base}/readyz")
        assert not_ready.status_code == 503
        assert not_ready.json()["breakers"]["model"] == "open"
        # Redis goes away: the store check fails too
        redis_server.stop()
        down = await http.get(f"{base}/readyz")
        assert down.status_code == 503 and down.json()["checks"]["result_store"] is False
        assert (await http.get(f"{base}/healthz")).status_code == 200  # alive all the same
        redis_server.start()
