"""The rollout operations surface against real Redis, the real CLI and a real uvicorn
gateway: ``batchfleet rollout set|promote|rollback|status`` (every ``--json`` form), the
admin-only HTTP endpoints, and model discovery (``GET /v1/models``, ``Client.models()``).

Versions are registered the way a worker's heartbeat registers them (``serve``), so these
tests need no multi-version worker; the discovery test runs a real one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import RedisModelRegistry, open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.rollout_stats import (
    ComparisonDelta,
    Difference,
    RedisRolloutStats,
    VersionDelta,
)
from batchfleet.producers import AsyncClient, Client
from batchfleet.producers.gateway import KeyRing, hash_key
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Declaration, ModelVersion, TensorSpec
from tests.e2e.test_gateway import settings as gateway_settings
from tests.support.fleet import running_worker
from tests.support.gateway_main import live_gateway

pytestmark = pytest.mark.e2e
NS = "ro"
F10, F1 = TensorSpec("float32", (10,)), TensorSpec("float32", (1,))
VERSIONS = [ModelVersion(label, f"sha256:{label}", F10, F1) for label in ("default", "v2", "v3")]
ADMIN, USER, MLP = "bfk_admin", "bfk_user", "bfk_mlp"
KEYS = KeyRing.parse(f"admin:{hash_key(ADMIN)}:*:scopes=admin\n"
                     f"user:{hash_key(USER)}:*\nmlp:{hash_key(MLP)}:demo-mlp")


async def _cli(*args: str) -> tuple[int, str, str]:
    """The CLI in-process (it runs its own event loop: off this one, in a thread)."""
    out = await asyncio.to_thread(CliRunner(env={"COLUMNS": "200"}).invoke, app, list(args))
    return out.exit_code, out.stdout, out.stderr


@pytest.fixture
async def registry(redis_url: str) -> AsyncIterator[RedisModelRegistry]:
    """"w-test" serves three versions and beats (reporting no policy epoch), as a live
    worker that has not picked up any policy would: only a beating worker is live."""
    reg = open_model_registry(redis_url, Names(NS))
    await reg.serve("w-test", {"demo-mlp": VERSIONS})
    client = redis_client(redis_url)
    heartbeats = RedisHeartbeats(client, Names(NS))

    async def beat() -> None:
        while True:
            await heartbeats.write("w-test", {"worker_id": "w-test", "seen_at": time.time()},
                                   10)
            await asyncio.sleep(1.0)

    beating = asyncio.create_task(beat())
    yield reg
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beating
    await client.aclose()
    await reg.close()


async def _rollout(redis_url: str, *args: str) -> Any:
    code, out, err = await _cli("rollout", *args, "--broker", redis_url, "--namespace", NS)
    assert code == 0, err
    return json.loads(out) if "--json" in args else out


async def _publish_stats(redis_url: str, epoch: int) -> None:
    """What workers publish per version and role (R3's writer): 90 stable, 10 canary (1 error)."""
    raw = redis_client(redis_url)
    stable, canary = VersionDelta(), VersionDelta()
    stable.add_batch(90, 0, 2.0)
    canary.add_batch(10, 1, 3.0)
    try:
        await RedisRolloutStats(raw, Names(NS)).flush_versions(
            "demo-mlp", epoch, {("default", "stable"): stable, ("v2", "canary"): canary})
    finally:
        await raw.aclose()


async def test_cli_set_and_status_json(registry: RedisModelRegistry, redis_url: str) -> None:
    at = ("--broker", redis_url, "--namespace", NS)

    async def rollout(*args: str) -> Any:
        return await _rollout(redis_url, *args)

    # status before any change: the default policy, no history, stats absent
    empty = await rollout("status", "demo-mlp")
    assert "demo-mlp: epoch 0, stable default" in empty and "stats: absent" in empty

    policy = await rollout("set", "demo-mlp", "--stable", "default", "--canary", "v2",
                           "--percent", "20", "--shadow", "v3", "--guard-window", "50",
                           "--who", "alice", "--why", "try v2", "--json")
    assert policy == {"stable": "default", "canary": "v2", "percent": 20.0, "shadow": "v3",
                      "previous": None, "epoch": 1,
                      "guard": {"error_points": 5.0, "p99_ratio": 2.0, "min_window": 50}}
    # refused, one line, nothing written
    code, _, err = await _cli("rollout", "set", "demo-mlp", "--stable", "default",
                              "--canary", "v9", "--percent", "5", *at)
    assert code == 1 and "no version 'v9'" in err and "default, v2, v3" in err
    code, _, err = await _cli("rollout", "set", "demo-mlp", "--stable", "default",
                              "--canary", "v2", *at)
    assert code == 2 and "--percent" in err

    await _publish_stats(redis_url, 1)
    status = await rollout("status", "demo-mlp", "--json")
    assert status["model"] == "demo-mlp" and status["policy"] == policy
    assert status["stats_available"] is True
    versions = status["versions"]
    assert {label: (v["role"], v["version"], v["workers"]) for label, v in versions.items()} == {
        "default": ("stable", "sha256:default", ["w-test"]),
        "v2": ("canary", "sha256:v2", ["w-test"]), "v3": ("shadow", "sha256:v3", ["w-test"])}
    canary_stats = versions["v2"]["stats"]["roles"]["canary"]
    assert (canary_stats["requests"], canary_stats["errors"]) == (10, 1)
    assert canary_stats["error_rate"] == pytest.approx(0.1)
    assert canary_stats["p50_compute_ms"] >= 3.0
    assert versions["default"]["stats"]["roles"]["stable"]["requests"] == 90
    assert versions["v3"]["stats"] is None
    # "w-test" beats but reports no epoch, so not converged yet
    assert status["workers"] == {"w-test": {"labels": ["default", "v2", "v3"], "epoch": None}}
    assert status["converged"] is False
    assert [(h["who"], h["why"], h["action"]) for h in status["history"]] == [
        ("alice", "try v2", "set")]
    table = await rollout("status", "demo-mlp")
    assert "canary v2 at 20%" in table and "alice" in table and "try v2" in table
    code, _, err = await _cli("rollout", "status", "nope", *at)
    assert code == 1 and "'nope'" in err


async def test_cli_promote_and_rollback_json(registry: RedisModelRegistry,
                                             redis_url: str) -> None:
    at = ("--broker", redis_url, "--namespace", NS)

    async def rollout(*args: str) -> Any:
        return await _rollout(redis_url, *args)

    await rollout("set", "demo-mlp", "--stable", "default", "--canary", "v2", "--percent", "20",
                  "--shadow", "v3", "--json")
    promoted = await rollout("promote", "demo-mlp", "--why", "v2 is fine", "--json")
    assert (promoted["stable"], promoted["canary"], promoted["shadow"],
            promoted["previous"], promoted["epoch"]) == ("v2", None, "v3", "default", 2)
    first = await rollout("rollback", "demo-mlp", "--json")  # the shadow goes first
    assert (first["stable"], first["shadow"], first["epoch"]) == ("v2", None, 3)
    second = await rollout("rollback", "demo-mlp", "--why", "v2 bad", "--json")
    assert (second["stable"], second["previous"], second["epoch"]) == ("default", None, 4)
    code, _, err = await _cli("rollout", "rollback", "demo-mlp", *at)
    assert code == 1 and "nothing to roll back" in err
    code, _, err = await _cli("rollout", "promote", "demo-mlp", *at)
    assert code == 1 and "no canary to promote" in err

    history = (await rollout("status", "demo-mlp", "--json"))["history"]
    assert [(h["action"], h["policy"]["epoch"]) for h in history] == [
        ("rollback", 4), ("rollback", 3), ("promote", 2), ("set", 1)]
    assert history[0]["why"] == "v2 bad" and "@" in history[0]["who"]  # user@host


async def test_cli_guard_flags_and_the_agreement_gate(registry: RedisModelRegistry,
                                                     redis_url: str) -> None:
    """``--guard-psi``, ``--guard-nan-points`` and ``--guard-agreement`` are stored and
    shown; a shadow recorded at 60% arg-max agreement blocks ``set --canary`` and
    ``promote`` with the reason printed, and ``--force`` overrides both."""
    at = ("--broker", redis_url, "--namespace", NS)

    async def rollout(*args: str) -> Any:
        return await _rollout(redis_url, *args)

    shadowing = await rollout("set", "demo-mlp", "--stable", "default", "--shadow", "v2",
                              "--guard-psi", "0.2", "--guard-nan-points", "1",
                              "--guard-agreement", "0.9", "--json")
    assert shadowing["guard"] == {"error_points": 5.0, "p99_ratio": 2.0, "min_window": 200,
                                  "psi": 0.2, "nan_points": 1.0, "agreement": 0.9}
    assert (await rollout("status", "demo-mlp", "--json"))["policy"]["guard"] == \
        shadowing["guard"]
    assert ("guard: errors +5 points, p99 2x, window 200 requests, PSI 0.2, NaN +1 points, "
            "agreement 0.9") in await rollout("status", "demo-mlp")
    delta = ComparisonDelta(stable="default", shadow="v2")
    for agrees in [True] * 60 + [False] * 40:
        delta.add(Difference(0.5, 0.5, 1, agrees))
    raw = redis_client(redis_url)
    try:
        await RedisRolloutStats(raw, Names(NS)).flush_comparisons(
            "demo-mlp", shadowing["epoch"], delta)
    finally:
        await raw.aclose()

    code, _, err = await _cli("rollout", "set", "demo-mlp", "--stable", "default",
                              "--canary", "v2", "--percent", "10", *at)
    assert code == 1 and "refusing to make 'v2' the canary" in err, err
    assert "60.00% over 100 compared requests" in err and "--force" in err
    forced = await rollout("set", "demo-mlp", "--stable", "default", "--canary", "v2",
                           "--percent", "10", "--force", "--json")
    assert forced["canary"] == "v2" and forced["epoch"] == shadowing["epoch"] + 1
    code, _, err = await _cli("rollout", "promote", "demo-mlp", *at)
    assert code == 1 and "refusing to promote 'v2'" in err, err
    promoted = await rollout("promote", "demo-mlp", "--force", "--json")
    assert promoted["stable"] == "v2"
    # 0 turns an optional check off again
    off = await rollout("set", "demo-mlp", "--stable", "v2", "--guard-psi", "0", "--json")
    assert "psi" not in off["guard"] and off["guard"]["agreement"] == 0.9


async def test_an_http_guard_body_sets_the_output_thresholds_and_force_passes_the_gate(
        registry: RedisModelRegistry, redis_url: str) -> None:
    """``PUT …/rollout``: a ``guard`` object sets each threshold it names (0 turns ``psi``,
    ``nan_points`` or ``agreement`` off) and keeps those it leaves out; the answer
    carries them. A canary whose recorded shadow agreement is below ``agreement`` is
    refused (422, nothing changes) unless ``force``, and so is its promotion."""
    await _rollout(redis_url, "set", "demo-mlp", "--stable", "default", "--guard-psi", "0.2",
                   "--guard-nan-points", "1", "--guard-agreement", "0.9")
    url, admin = "/v1/models/demo-mlp/rollout", {"X-API-Key": ADMIN}
    with live_gateway(gateway_settings(redis_url, namespace=NS, keys=KEYS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            kept = await http.put(url, headers=admin, json={
                "stable": "default", "shadow": "v2",
                "guard": {"error_points": 3, "p99_ratio": 4, "min_window": 100}})
            assert kept.status_code == 200, kept.text
            assert kept.json()["guard"] == {"error_points": 3.0, "p99_ratio": 4.0,
                                            "min_window": 100, "psi": 0.2,
                                            "nan_points": 1.0, "agreement": 0.9}
            delta = ComparisonDelta(stable="default", shadow="v2")
            for agrees in [True] * 60 + [False] * 40:
                delta.add(Difference(0.5, 0.5, 1, agrees))
            raw = redis_client(redis_url)
            try:
                await RedisRolloutStats(raw, Names(NS)).flush_comparisons(
                    "demo-mlp", kept.json()["epoch"], delta)
            finally:
                await raw.aclose()
            body = {"stable": "default", "canary": "v2", "percent": 10,
                    "guard": {"psi": 0.3, "nan_points": 0, "agreement": 0.8}}
            refused = await http.put(url, headers=admin, json=body)
            assert refused.status_code == 422, refused.text
            assert "refusing to make 'v2' the canary" in refused.json()["error"]["message"]
            assert (await registry.get_policy("demo-mlp")).canary is None
            bad = await http.put(url, headers=admin, json={**body, "guard": {"psi": -1}})
            assert bad.status_code == 422
            forced = await http.put(url, headers=admin, json={**body, "force": True})
            assert forced.status_code == 200, forced.text
            assert forced.json()["canary"] == "v2"
            promote = f"{url}/promote"
            refused = await http.post(promote, headers=admin, json={"why": "ship"})
            assert refused.status_code == 422, refused.text
            assert "refusing to promote 'v2'" in refused.json()["error"]["message"]
            promoted = await http.post(promote, headers=admin,
                                       json={"why": "ship", "force": True})
            assert promoted.status_code == 200 and promoted.json()["stable"] == "v2"
            assert forced.json()["guard"] == {"error_points": 3.0, "p99_ratio": 4.0,
                                              "min_window": 100, "psi": 0.3,
                                              "nan_points": None, "agreement": 0.8}
    policy = await registry.get_policy("demo-mlp")
    assert policy.stable == "v2" and policy.guard.to_wire() == {
        "error_points": 3.0, "p99_ratio": 4.0, "min_window": 100, "psi": 0.3,
        "agreement": 0.8}


async def test_http_rollout_needs_an_admin_key(registry: RedisModelRegistry,
                                               redis_url: str) -> None:
    with live_gateway(gateway_settings(redis_url, namespace=NS, keys=KEYS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            def h(key: str) -> dict[str, str]:
                return {"X-API-Key": key}

            body = {"stable": "default", "canary": "v2", "percent": 10, "why": "http canary"}
            url = "/v1/models/demo-mlp/rollout"
            # a key that may use the model but is not admin: 403; one that may not: 404
            for key, status in ((USER, 403), (MLP, 403)):
                assert (await http.put(url, json=body, headers=h(key))).status_code == status
                assert (await http.get(url, headers=h(key))).status_code == status
                assert (await http.post(f"{url}/rollback", headers=h(key))).status_code == status
            hidden = await http.get("/v1/models/demo-encoder/rollout", headers=h(MLP))
            assert hidden.status_code == 404
            assert (await http.get(url)).status_code == 401
            assert (await registry.get_policy("demo-mlp")).epoch == 0  # nothing changed

            put = await http.put(url, json=body, headers=h(ADMIN))
            assert put.status_code == 200, put.text
            assert put.json()["canary"] == "v2" and put.json()["epoch"] == 1
            bad = await http.put(url, json={**body, "canary": "v9"}, headers=h(ADMIN))
            assert bad.status_code == 422 and "no version 'v9'" in bad.json()["error"]["message"]
            read = await http.get(url, headers=h(ADMIN))
            assert read.status_code == 200
            assert read.json()["history"][0]["who"] == "api-key:admin"
            assert read.json()["history"][0]["why"] == "http canary"
            promoted = await http.post(f"{url}/promote", json={"why": "ok"}, headers=h(ADMIN))
            assert promoted.status_code == 200 and promoted.json()["stable"] == "v2"
            back = await http.post(f"{url}/rollback", headers=h(ADMIN))
            assert back.status_code == 200 and back.json()["stable"] == "default"
            assert back.json()["epoch"] == 3
            again = await http.post(f"{url}/rollback", headers=h(ADMIN))
            assert again.status_code == 422
            unknown = await http.get("/v1/models/nope/rollout", headers=h(ADMIN))
            assert unknown.status_code == 404


async def test_models_endpoints_and_client_models(redis_url: str) -> None:
    registry = open_model_registry(redis_url, Names(NS))
    await registry.declare("fraud", Declaration(1.0, F10, F1))
    await registry.close()
    async with running_worker(redis_url, namespace=NS, models=("demo-mlp",)) as worker:
        wid = worker.settings.worker_id
        with live_gateway(gateway_settings(redis_url, namespace=NS, keys=KEYS)) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                every = await http.get("/v1/models", headers={"X-API-Key": USER})
                assert every.status_code == 200
                by_name = {m["name"]: m for m in every.json()["models"]}
                assert set(by_name) == {"demo-mlp", "fraud"}
                mlp = by_name["demo-mlp"]
                assert mlp["input"] == {"dtype": "float32", "shape": [10]}
                assert [v["label"] for v in mlp["versions"]] == ["default"]
                assert mlp["versions"][0]["version"].startswith("sha256:")
                assert mlp["policy"]["stable"] == "default" and mlp["policy"]["epoch"] == 0
                assert [w["worker"] for w in mlp["workers"]] == [wid]
                fraud = by_name["fraud"]
                assert (fraud["declared"], fraud["input"], fraud["output"], fraud["workers"]) == (
                    True, {"dtype": "float32", "shape": [10]},
                    {"dtype": "float32", "shape": [1]}, [])
                # a key sees only the models its allowlist permits
                only = await http.get("/v1/models", headers={"X-API-Key": MLP})
                assert [m["name"] for m in only.json()["models"]] == ["demo-mlp"]
                assert (await http.get("/v1/models/fraud",
                                       headers={"X-API-Key": MLP})).status_code == 404
                one = await http.get("/v1/models/demo-mlp", headers={"X-API-Key": MLP})
                assert one.status_code == 200 and one.json() == mlp
                # the real worker's heartbeat reports the epoch it routes by
                rollout = (await http.get("/v1/models/demo-mlp/rollout",
                                          headers={"X-API-Key": ADMIN})).json()
                assert rollout["workers"] == {wid: {"labels": ["default"], "epoch": 0}}
                assert rollout["converged"] is True
                assert (await http.get("/v1/models/nope",
                                       headers={"X-API-Key": USER})).status_code == 404
        async with AsyncClient(redis_url, namespace=NS) as client:
            records = await client.models()
        assert [r.name for r in records] == ["demo-mlp", "fraud"]
        assert records[0].versions["default"].input == F10
        assert wid in records[0].served

    def sync_models() -> list[str]:
        with Client(redis_url, namespace=NS) as client:
            return [r.name for r in client.models()]

    assert await asyncio.to_thread(sync_models) == ["demo-mlp", "fraud"]
