"""The operator console (issue 30) against a real fleet: a real worker serving two models,
real Redis, the console under real uvicorn. Its JSON matches ``status --json`` and the
worker's Prometheus counters; a model's req/s is its own; sign-in, cookie and CSRF rules;
an action replays a dead letter that then succeeds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchfleet.producers import AsyncClient
from batchfleet.producers.console.sessions import COOKIE, KeySource
from batchfleet.producers.console.settings import ConsoleSettings
from batchfleet.producers.gateway import hash_key
from batchfleet.workers import Worker
from batchfleet.workers.middleware.output_stats import OutputStats
from batchfleet.workers.models import load_model
from tests.support.console import live_console
from tests.support.fleet import running_worker
from tests.support.models import POISON, Switchable, poison_model, switchable

pytestmark = pytest.mark.e2e

ROWS = np.random.default_rng(30).random((20, 10), dtype=np.float32)


async def until(read: Callable[[], Any], done: Callable[[Any], bool],
                timeout_s: float = 30.0) -> Any:
    """``read()`` (sync or async) again until ``done`` holds; the last value either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = read()
        if asyncio.iscoroutine(value):
            value = await value
        if done(value) or loop.time() > deadline:
            return value
        await asyncio.sleep(0.2)


@asynccontextmanager
async def two_model_worker(redis_url: str, **overrides: Any) -> AsyncIterator[Worker]:
    """demo-mlp and a poison-sensitive demo-mlp on one worker."""
    handlers = {"demo-mlp": load_model("demo-mlp"), "poison": poison_model()}
    async with running_worker(redis_url, handlers=handlers, sample_every_s=0.2,
                              max_attempts=1, breaker_failures=1000, **overrides) as worker:
        yield worker


async def traffic(client: AsyncClient, model: str, stop: asyncio.Event) -> list[str]:
    ids: list[str] = []
    while not stop.is_set():
        ids += await client.submit_many(model, ROWS)
        await asyncio.sleep(0.1)
    return ids


def _cli_json(*args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "batchfleet", *args, "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _status_json(redis_url: str) -> Any:
    return _cli_json("status", "--broker", redis_url)


def _prometheus(worker: Worker, model: str) -> dict[str, float]:
    """Requests by status and the batch-size histogram's sum and count, over lanes."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(worker.metrics.exposition().decode()):
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            if s.name == "batchfleet_requests_total":
                out[s.labels["status"]] = out.get(s.labels["status"], 0) + s.value
            elif s.name in ("batchfleet_batch_size_sum", "batchfleet_batch_size_count"):
                out[s.name] = out.get(s.name, 0) + s.value
    return out


def _model(overview: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in overview["models"] if m["model"] == name)


async def test_json_matches_status_and_prometheus_and_each_model_has_its_own_rate(
        redis_url: str) -> None:
    async with two_model_worker(redis_url) as worker, AsyncClient(redis_url) as client, \
            httpx.AsyncClient(timeout=30) as http:
        with live_console(ConsoleSettings(broker=redis_url)) as base:
            async def overview() -> Any:
                return (await http.get(base + "api/overview")).json()

            stop = asyncio.Event()
            producer = asyncio.create_task(traffic(client, "demo-mlp", stop))
            busy = await until(overview, lambda o: _model(o, "demo-mlp")["rps"] > 0)
            # the defect: the worker's whole rate was shown for each of its models
            assert _model(busy, "demo-mlp")["rps"] > 0 and _model(busy, "poison")["rps"] == 0
            stop.set()
            ids = await producer
            assert {r.status for r in await client.wait_many(ids, timeout=60)} == {"succeeded"}
            bad = ROWS[:4].copy()
            bad[:, 0] = POISON
            poisoned = await client.submit_many("poison", bad)
            ok = await client.submit_many("poison", ROWS[4:10])
            assert {r.status for r in await client.wait_many(poisoned, timeout=60)} == {"failed"}
            await client.wait_many(ok, timeout=60)

            def settled(o: Any) -> bool:
                stats = {w["worker_id"]: w["model_stats"] for w in o["workers"]}
                (mine,) = stats.values()
                return (mine.get("demo-mlp", {}).get("succeeded") == len(ids)
                        and mine.get("poison", {}).get("failed") == 4
                        and _model(o, "poison")["dlq"] == 4)

            seen = await until(overview, settled)
            assert settled(seen)
            await worker.find(OutputStats).flush()  # issue 27's panel: `models outputs`

            def counted(o: Any) -> dict[str, Any]:
                return {m: {r["version"]: r["count"] for r in rows}
                        for m, rows in o["outputs"]["models"].items()}

            stats = await until(overview, lambda o: counted(o).get("poison"))
            cli = await asyncio.to_thread(_cli_json, "models", "outputs", "demo-mlp",
                                          "--broker", redis_url)
            status = await asyncio.to_thread(_status_json, redis_url)
            letters = (await http.get(base + "api/dlq", params={"model": "poison",
                                                                "limit": 3})).json()
    for name in ("demo-mlp", "poison"):
        row = _model(seen, name)
        lane = next(x for x in status["lanes"] if x["model"] == name)
        for figure, same in (("depth", "depth"), ("dlq", "dlq"), ("workers", "workers"),
                             ("mean_batch_size", "mean_batch_size"),
                             ("error_rate", "error_rate")):
            assert row[figure] == lane[same] or figure == "depth", (name, figure)
        prom = _prometheus(worker, name)
        assert row["mean_batch_size"] == round(
            prom["batchfleet_batch_size_sum"] / prom["batchfleet_batch_size_count"], 2)
        done = prom.get("succeeded", 0) + prom.get("failed", 0) + prom.get("expired", 0)
        assert row["error_rate"] == round(prom.get("failed", 0) / done, 4)
    assert _model(seen, "poison")["error_rate"] == round(4 / 10, 4)
    # each version's summary and drift, the rows `models outputs --json` prints; the
    # failed requests never counted
    assert counted(stats) == {"demo-mlp": {"default": len(ids)}, "poison": {"default": 6}}
    assert stats["outputs"]["models"]["demo-mlp"] == cli
    (row,) = cli
    assert row["role"] == "stable" and row["reference"] is None and row["psi"] is None
    assert 0.0 < row["p50"] < 1.0 and row["nan_rate"] == 0.0
    (queue,) = seen["dlq"]
    assert queue["model"] == "poison" and len(queue["letters"]) == 4
    assert sum(queue["error_types"].values()) == 4
    assert [x["request_id"] for x in letters["letters"]] == [
        x["request_id"] for x in queue["letters"][:3]]  # newest first, paged
    assert letters["next_before"] == queue["letters"][2]["entry_id"]


KEYS = (f"root:{hash_key('k-root')}:*:scopes=admin\n"
        f"ops:{hash_key('k-ops')}:*:scopes=admin\n"
        f"bill:{hash_key('k-bill')}:*\n")


async def test_off_loopback_a_key_a_cookie_and_csrf_are_needed(redis_url: str,
                                                                tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(KEYS)
    settings = ConsoleSettings(broker=redis_url, host="0.0.0.0", keys_file=str(keys))
    with live_console(settings, KeySource(str(keys))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            assert (await http.get("api/overview")).status_code == 401
            assert (await http.post("api/session", json={"key": "nope"})).status_code == 401
            assert (await http.post("api/session", json={"key": "k-bill"})).status_code == 403
            signed = await http.post("api/session", json={"key": "k-root"})
            assert signed.status_code == 200
            flags = signed.headers["set-cookie"].lower()
            assert "httponly" in flags and "samesite=strict" in flags and "secure" in flags
            cookie = {"Cookie": f"{COOKIE}={signed.cookies[COOKIE]}"}
            csrf = signed.json()["csrf"]
            assert (await http.get("api/overview", headers=cookie)).status_code == 200
            # an action without the CSRF token (or with another session's) is refused
            body = {"request_id": "no-such-request"}
            refused = await http.post("api/actions/cancel", json=body, headers=cookie)
            assert refused.status_code == 403
            other = (await http.post("api/session", json={"key": "k-ops"})).json()["csrf"]
            assert (await http.post("api/actions/cancel", json=body,
                                    headers={**cookie, "X-CSRF-Token": other})).status_code == 403
            done = await http.post("api/actions/cancel", json=body,
                                   headers={**cookie, "X-CSRF-Token": csrf})
            assert done.status_code == 200, done.text
            assert done.json()["who"] == "root" and done.json()["outcome"].startswith("unknown")
            # the key is removed from the file: its cookie stops working, others' do not
            keys.write_text(KEYS.replace(f"root:{hash_key('k-root')}:*:scopes=admin\n", ""))
            assert (await http.get("api/overview", headers=cookie)).status_code == 401
            assert (await http.get("api/overview",
                                   headers={"X-API-Key": "k-ops"})).status_code == 200
    # the loopback console without a keys file opens, and its cookie is not Secure
    with live_console(ConsoleSettings(broker=redis_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            assert (await http.get("api/overview")).status_code == 200
            local = await http.post("api/session", json={})
            assert "secure" not in local.headers["set-cookie"].lower()
            assert (await http.post("api/actions/cancel", json={"request_id": "x"})
                    ).status_code == 403


async def test_an_action_replays_a_dead_letter_and_the_request_then_succeeds(
        redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              max_attempts=1, breaker_failures=1000) as _, \
            AsyncClient(redis_url) as client:
        model.broken = True
        rid = await client.submit("switch", ROWS[0])
        assert (await client.wait(rid, timeout=30)).status == "failed"
        model.broken = False
        with live_console(ConsoleSettings(broker=redis_url)) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                session = (await http.post("api/session", json={})).json()
                shown = await until(lambda: http.get("api/overview"),
                                    lambda r: r.json()["dlq"])
                (queue,) = shown.json()["dlq"]
                assert [x["request_id"] for x in queue["letters"]] == [rid]
                done = await http.post("api/actions/replay",
                                       json={"model": "switch", "request_id": rid},
                                       headers={"X-CSRF-Token": session["csrf"]})
                assert done.status_code == 200, done.text
                assert done.json()["outcome"] == "replayed" and done.json()["who"] == "local"
                result = await client.wait(rid, timeout=30)
                assert result.status == "succeeded"
                log = (await http.get("api/overview")).json()["actions"]
                assert log[0]["action"] == "replay" and log[0]["target"] == rid


async def test_pausing_a_models_lanes_holds_its_requests_until_resumed(redis_url: str) -> None:
    """The operator pause: the worker stops fetching the paused model only (its other
    model flows), the registry record says who paused it, and a resume lets it run."""
    async with two_model_worker(redis_url) as worker, AsyncClient(redis_url) as client, \
            httpx.AsyncClient(timeout=30) as http:
        with live_console(ConsoleSettings(broker=redis_url)) as base:
            csrf = {"X-CSRF-Token": (await http.post(base + "api/session", json={})
                                     ).json()["csrf"]}
            done = await http.post(base + "api/actions/pause", headers=csrf,
                                   json={"model": "poison", "why": "bad inputs upstream"})
            assert done.status_code == 200, done.text
            await until(lambda: worker.vitals()["operator_paused"], lambda p: p == ["poison"])
            # the fetch loop applied it: the consumer paused the lanes before its next fetch
            await until(worker.metrics.lane_pause_counts, lambda c: c.get("poison") == 1)
            held = await client.submit_many("poison", ROWS[:5])
            flowing = await client.submit_many("demo-mlp", ROWS[:5])
            assert {r.status for r in await client.wait_many(flowing, timeout=30)} == {
                "succeeded"}
            await asyncio.sleep(1.5)  # several fetch rounds: none may take a paused lane
            assert {(await client.get(rid)).status for rid in held} == {"pending"}  # type: ignore[union-attr]
            row = _model((await http.get(base + "api/overview")).json(), "poison")
            assert row["paused"]["who"] == "local" and row["depth"] == 5
            assert row["paused"]["why"] == "bad inputs upstream"
            resumed = await http.post(base + "api/actions/resume", headers=csrf,
                                      json={"model": "poison"})
            assert resumed.status_code == 200, resumed.text
            results = await client.wait_many(held, timeout=30)
            assert {r.status for r in results} == {"succeeded"}
            log = (await http.get(base + "api/overview")).json()["actions"]
            assert [a["action"] for a in log[:2]] == ["resume", "pause"]


async def test_the_gateway_mounts_the_console_behind_its_admin_keys(redis_url: str) -> None:
    from batchfleet.producers.gateway import GatewaySettings, KeyRing
    from tests.support.gateway_main import live_gateway

    settings = GatewaySettings(broker=redis_url, keys=KeyRing.parse(KEYS), console=True)
    with live_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            page = await http.get("/console/")
            assert page.status_code == 200 and "static/uPlot.iife.min.js" in page.text
            script = await http.get("/console/static/uPlot.iife.min.js")
            assert script.status_code == 200 and len(script.content) > 10_000
            assert (await http.get("/console/api/overview")).status_code == 401
            assert (await http.get("/console/api/overview",
                                   headers={"X-API-Key": "k-bill"})).status_code == 403
            shown = await http.get("/console/api/overview", headers={"X-API-Key": "k-root"})
            assert shown.status_code == 200 and shown.json()["namespace"] == "bf"


async def test_the_cli_pauses_a_models_lanes_as_the_console_does_and_status_lists_it(
        redis_url: str) -> None:
    """``models pause MODEL --why`` sets the registry field the console's Pause sets: the
    worker stops fetching that model, ``status`` lists it (who, why), the console shows it,
    and ``models resume`` lets its held requests run."""
    from tests.support.cli import run_cli

    at = ("--broker", redis_url)
    async with two_model_worker(redis_url) as worker, AsyncClient(redis_url) as client:
        code, out, err = await run_cli("models", "pause", "poison", "--why", "bad upstream",
                                       "--who", "alice", *at)
        assert code == 0 and "lanes paused" in out, err
        await until(lambda: worker.vitals()["operator_paused"], lambda p: p == ["poison"])
        await until(worker.metrics.lane_pause_counts, lambda c: c.get("poison") == 1)
        held = await client.submit_many("poison", ROWS[:3])
        await asyncio.sleep(1.0)  # fetch rounds: none may take the paused lane
        assert {(await client.get(rid)).status for rid in held} == {"pending"}  # type: ignore[union-attr]
        status = await asyncio.to_thread(_status_json, redis_url)
        assert set(status["paused"]) == {"poison"}
        assert status["paused"]["poison"]["who"] == "alice"
        assert status["paused"]["poison"]["why"] == "bad upstream"
        code, table, err = await run_cli("status", "--once", *at)
        assert code == 0 and "poison: lanes paused by alice" in table, err
        with live_console(ConsoleSettings(broker=redis_url)) as base:
            async with httpx.AsyncClient(timeout=30) as http:
                row = _model((await http.get(base + "api/overview")).json(), "poison")
        assert row["paused"]["who"] == "alice"
        code, out, err = await run_cli("models", "resume", "poison", *at)
        assert code == 0 and "lanes resumed" in out, err
        assert {r.status for r in await client.wait_many(held, timeout=30)} == {"succeeded"}
        code, _, err = await run_cli("models", "pause", "nope", *at)
    assert code == 1 and "not in the registry" in err
    assert (await asyncio.to_thread(_status_json, redis_url))["paused"] == {}
