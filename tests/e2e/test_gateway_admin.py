"""Admin routes at the gateway: the fleet snapshot and the DLQ, the same documents and the
same library calls as ``batchfleet status --json`` and ``batchfleet dlq``; admin keys only.

Real uvicorn, real Redis, a real worker serving a model that fails on demand."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from batchfleet.producers import AsyncClient
from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
from tests.support.fleet import running_worker
from tests.support.gateway_main import live_gateway
from tests.support.models import Switchable, switchable

pytestmark = pytest.mark.e2e

KEYS_TEXT = "\n".join([f"bill:{hash_key('k-bill')}:*",
                       f"root:{hash_key('k-root')}:*:scopes=admin"])
BILL, ROOT = {"X-API-Key": "k-bill"}, {"X-API-Key": "k-root"}
FAILING = {"max_attempts": 2, "breaker_failures": 1000, "retry_base_s": 0.01,
           "retry_cap_s": 0.05}


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    with live_gateway(GatewaySettings(broker=redis_url, keys=KeyRing.parse(KEYS_TEXT))) as base:
        yield base


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway, timeout=60) as client:
        yield client


async def _cli_json(*args: str) -> Any:
    """The CLI's JSON, in a thread: the worker shares this test's event loop."""
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "batchfleet", *args], capture_output=True,
        text=True, timeout=60, check=False, env=os.environ | {"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _dead_lettered(client: AsyncClient, model: Switchable, n: int) -> list[str]:
    model.broken = True  # after warm-up: every batch fails until it is fixed
    ids = await client.submit_many("switch", np.random.default_rng(3).random((n, 10),
                                                                             dtype=np.float32))
    assert {r.status for r in await client.wait_many(ids, timeout=30)} == {"failed"}
    return ids


def _sorted(report: dict[str, Any]) -> dict[str, Any]:
    """Replay goes in DLQ order; compare as sets."""
    return {**report, "replayed": sorted(report["replayed"])}


async def test_a_key_without_the_admin_scope_gets_403(http: httpx.AsyncClient) -> None:
    calls = [("GET", "/v1/fleet", None), ("GET", "/v1/dlq?model=switch", None),
             ("POST", "/v1/dlq/replay", {"model": "switch", "dry_run": True}),
             ("GET", "/v1/models/switch/outputs", None)]
    for method, path, body in calls:
        denied = await http.request(method, path, json=body, headers=BILL)
        assert denied.status_code == 403, (path, denied.text)
        assert "admin" in denied.json()["error"]["message"]
        assert (await http.request(method, path, json=body)).status_code == 401


async def test_fleet_and_dlq_pages_are_what_the_cli_prints(
        http: httpx.AsyncClient, redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              **FAILING) as worker, AsyncClient(redis_url) as client:
        await _dead_lettered(client, model, 3)
        fleet = await http.get("/v1/fleet", headers=ROOT)
        cli = await _cli_json("status", "--broker", redis_url, "--json", "--once")
        first = await http.get("/v1/dlq", params={"model": "switch", "limit": 2}, headers=ROOT)
        assert first.status_code == 200, first.text
        cursor = first.json()["next_cursor"]
        rest = await http.get("/v1/dlq", params={"model": "switch", "limit": 2,
                                                 "cursor": cursor}, headers=ROOT)
        letters = await _cli_json("dlq", "list", "--broker", redis_url, "-m", "switch",
                                  "-o", "json")
    assert fleet.status_code == 200, fleet.text
    body = fleet.json()
    assert set(body) == set(cli)
    assert [w["worker_id"] for w in body["workers"]] == [worker.settings.worker_id] \
        == [w["worker_id"] for w in cli["workers"]]
    assert [(la["model"], la["lane"]) for la in body["lanes"]] \
        == [(la["model"], la["lane"]) for la in cli["lanes"]]
    assert body["totals"]["dlq"] == cli["totals"]["dlq"] == 3
    assert (body["namespace"], body["broker"]) == (cli["namespace"], cli["broker"])
    assert len(first.json()["letters"]) == 2 and cursor
    assert len(rest.json()["letters"]) == 1 and rest.json()["next_cursor"] is None
    assert first.json()["letters"] + rest.json()["letters"] == letters
    bad = await http.get("/v1/dlq", params={"model": "switch", "cursor": "x"}, headers=ROOT)
    assert bad.status_code == 422


async def test_replay_dry_run_changes_nothing_and_replay_reruns_the_request(
        http: httpx.AsyncClient, redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)}, **FAILING), \
            AsyncClient(redis_url) as client:
        ids = await _dead_lettered(client, model, 3)
        model.broken = False  # the fix is deployed
        plan = await http.post("/v1/dlq/replay", json={"request_ids": ids[:2], "dry_run": True},
                               headers=ROOT)
        assert plan.status_code == 200, plan.text
        assert _sorted(plan.json()) == {"dry_run": True, "replayed": sorted(ids[:2]),
                                        "skipped": {}}
        listed = await http.get("/v1/dlq", params={"model": "switch"}, headers=ROOT)
        assert len(listed.json()["letters"]) == 3
        assert {r.status for r in await client.wait_many(ids, timeout=5)} == {"failed"}

        done = await http.post("/v1/dlq/replay", json={"request_ids": ids[:2]}, headers=ROOT)
        assert _sorted(done.json()) == {"dry_run": False, "replayed": sorted(ids[:2]),
                                        "skipped": {}}
        replayed = await client.wait_many(ids[:2], timeout=30)
        assert {r.status for r in replayed} == {"succeeded"}
        assert {r.generation for r in replayed} == {1}
        left = await http.get("/v1/dlq", params={"model": "switch"}, headers=ROOT)
        assert [dl["request_id"] for dl in left.json()["letters"]] == [ids[2]]
        assert (await client.wait(ids[2], timeout=5)).status == "failed"


async def test_model_outputs_are_what_models_outputs_prints(
        http: httpx.AsyncClient, redis_url: str) -> None:
    """``GET /v1/models/{model}/outputs`` is ``models outputs --inputs --json``."""
    import time

    from batchfleet.connectors import open_control_plane
    from batchfleet.connectors.output_stats import Flush
    from batchfleet.connectors.output_summary import summarise_batch

    plane = open_control_plane(redis_url)
    try:
        rows = list(np.random.default_rng(5).random((3000, 2)))
        await plane.output_stats.flush("scored", Flush(
            int(time.time()) // 60 * 60, 60, 3600,
            {("default", "outputs"): summarise_batch(rows, "scores"),
             ("default", "inputs"): summarise_batch(rows, None)}))
    finally:
        await plane.close()
    got = await http.get("/v1/models/scored/outputs?since_s=600", headers=ROOT)
    assert got.status_code == 200, got.text
    body = got.json()
    printed = await _cli_json("models", "outputs", "scored", "--inputs", "--json",
                              "--since-s", "600", "--broker", redis_url)
    assert body["versions"] == printed
    assert [(v["version"], v["role"], v["count"]) for v in printed] == [
        ("default", "stable", 6000)]
