"""Request control against real Redis, real workers and (for HTTP) a real uvicorn: cancel,
lane purge, ``check`` exit codes, ``dlq replay --dry-run`` and the multi-ID read."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from batchfleet.workers.middleware.cancels import CancelledDrop
from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from tests.support.fleet import running_worker
from tests.support.models import SLOW, Sleepy
from tests.support.transports import Fleet

pytestmark = pytest.mark.e2e

X = [0.25] * 10


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """A liveness bound only: the condition is what the test asserts."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=os.environ.copy())
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_a_queued_request_is_cancelled_and_never_computed(redis_url: str) -> None:
    ns = "rc-queued"
    names, raw = Names(ns), redis_client(redis_url)
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        keep = await client.submit("demo-mlp", X)
        gone = await client.submit("demo-mlp", X)
        waiting = asyncio.create_task(client.wait(gone, timeout=30))
        report = await client.cancel(gone)
        assert (report.outcome, report.status) == ("cancelled", "cancelled")
        # the cancel is announced to the submitter: its waiter ends at once
        assert (await asyncio.wait_for(waiting, 5)).status == "cancelled"
        assert (await client.cancel(gone)).outcome == "already_finished"
        assert (await client.cancel("never-there")).outcome == "unknown"
        async with running_worker(redis_url, namespace=ns) as worker:
            assert (await client.wait(keep, timeout=30)).status == "succeeded"
            drop = worker.find(CancelledDrop)
            await _until(lambda: _true(drop.dropped == 1))
            assert worker.stats.computed == 1  # only ``keep``
        done = await client.get(gone)
        assert done is not None and done.status == "cancelled" and done.error is not None
        assert done.error.type == "cancelled" and done.model == "demo-mlp"
    # the lane is empty and the cancel set too: workers stop looking at it
    assert await raw.xlen(names.stream("demo-mlp", "interactive")) == 0
    assert await raw.zcard(names.cancelled) == 0
    await raw.aclose()


async def _true(value: bool) -> bool:
    return value


async def test_a_request_already_computing_finishes_and_the_cancel_says_so(
        redis_url: str) -> None:
    ns = "rc-running"
    slow = TorchModuleHandler("slow", Sleepy(), input_spec=TensorSpec("float32", (10,)))
    async with running_worker(redis_url, namespace=ns, handlers={"slow": slow}) as worker, \
            AsyncClient(redis_url, namespace=ns) as client:
        rid = await client.submit("slow", np.full(10, SLOW, np.float32))
        await _until(lambda: _true(worker.compute.computing[1] > 0))
        report = await client.cancel(rid)
        assert (report.outcome, report.status) == ("already_running", "pending")
        assert "will finish" in report.message
        assert (await client.wait(rid, timeout=30)).status == "succeeded"
        assert worker.stats.computed == 1 and worker.find(CancelledDrop).dropped == 0


async def test_cancel_and_multi_read_over_http_follow_ownership(redis_url: str) -> None:
    """DELETE and ``GET /v1/requests?ids=`` answer another key's request exactly as a
    missing one; the owner cancels a queued request, and no worker ever computes it."""
    import httpx

    from batchfleet.connectors.model_registry import open_model_registry
    from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
    from batchfleet.schemas.registry import Declaration
    from tests.support.gateway_main import live_gateway

    ns = "rc-http"
    keys = "\n".join([f"bill:{hash_key('k-bill')}:*", f"eve:{hash_key('k-eve')}:*",
                      f"root:{hash_key('k-root')}:*:scopes=admin"])
    bill, eve, root = ({"X-API-Key": k} for k in ("k-bill", "k-eve", "k-root"))
    registry = open_model_registry(redis_url, Names(ns))
    await registry.declare("demo-mlp", Declaration(0.0))
    await registry.close()
    settings = GatewaySettings(broker=redis_url, namespace=ns, keys=KeyRing.parse(keys),
                               id_secret="test-secret-0123456789abcdef")
    with live_gateway(settings) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            sent = [(await http.post("/v1/models/demo-mlp/requests", json={"inputs": X},
                                     headers=bill)).json()["request_id"] for _ in range(3)]
            keep, gone, other = sent
            # another key: 404 for DELETE, exactly as for a made-up ID; nothing cancelled
            stolen = await http.delete(f"/v1/requests/{gone}", headers=eve)
            made_up = await http.delete("/v1/requests/nope-123", headers=eve)
            assert stolen.status_code == made_up.status_code == 404
            assert stolen.json()["error"]["type"] == made_up.json()["error"]["type"]
            many = await http.get("/v1/requests", params={"ids": f"{keep},nope-123"},
                                  headers=eve)
            assert many.status_code == 200
            assert many.json() == {"results": [], "not_found": [keep, "nope-123"]}

            done = await http.delete(f"/v1/requests/{gone}", headers=bill)
            assert done.status_code == 200, done.text
            assert done.json() == {"request_id": gone, "outcome": "cancelled",
                                   "status": "cancelled"}
            again = await http.delete(f"/v1/requests/{gone}", headers=root)  # admin: any key's
            assert again.json()["outcome"] == "already_finished"

            async with running_worker(redis_url, namespace=ns) as worker:
                read = await http.get(f"/v1/requests/{keep}", params={"wait": 20},
                                      headers=bill)
                assert read.json()["status"] == "succeeded"
                await _until(lambda: _true(worker.find(CancelledDrop).dropped == 1
                                           and worker.stats.computed == 2))
            many = await http.get("/v1/requests", params={"ids": f"{keep},{gone},x,{other}"},
                                  headers=bill)
            body = many.json()
            assert [r["request_id"] for r in body["results"]] == [keep, gone, other]
            assert [r["status"] for r in body["results"]] == ["succeeded", "cancelled",
                                                              "succeeded"]
            assert body["not_found"] == ["x"]
            too_many = await http.get("/v1/requests",
                                      params={"ids": ",".join(f"r{i}" for i in range(101))},
                                      headers=bill)
            assert too_many.status_code == 422


async def test_lane_purge_cancels_every_queued_request_and_waiters_end(redis_url: str) -> None:
    ns = "rc-purge"
    names, raw = Names(ns), redis_client(redis_url)
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        ids = await client.submit_many("demo-mlp", [X] * 1200, priority="bulk")
        fast = await client.submit("demo-mlp", X)  # interactive: not purged
        waiting = asyncio.create_task(client.wait_many(ids, timeout=60))
        await raw.xadd(names.stream("demo-mlp", "bulk"), {b"p": b"\xc1 not msgpack"})
        code, out, err = await _cli("lane", "purge", "demo-mlp", "--lane", "bulk", "--yes",
                                    "--broker", redis_url, "--namespace", ns)
        assert code == 0, err
        assert "cancelled 1200" in out and "undecodable 1" in out
        done = await asyncio.wait_for(waiting, 10)  # announced: the waiters end at once
        assert {r.status for r in done} == {"cancelled"}
        assert await raw.xlen(names.stream("demo-mlp", "bulk")) == 0
        assert await raw.xlen(names.undecodable_stream) == 1
        assert (await client.get(fast)).status == "pending"  # type: ignore[union-attr]
    code, _, err = await _cli("lane", "purge", "demo-mlp", "--yes",
                              "--broker", "kafka://127.0.0.1:1", "--results", redis_url)
    assert code == 2 and "Kafka cannot delete" in err and len(err.splitlines()) == 1
    await raw.aclose()


async def test_check_exit_codes(redis_url: str) -> None:
    from tests.support.models import Switchable, switchable

    ns = "rc-check"
    base = ("--broker", redis_url, "--namespace", ns)
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        async with running_worker(redis_url, namespace=ns):
            code, out, _ = await _cli("check", *base)
            assert (code, out.strip()) == (0, "healthy")
        # no live worker, and a lane whose oldest request is older than the threshold
        await client.submit("demo-mlp", X)
        await asyncio.sleep(1.2)
        code, out, _ = await _cli("check", *base, "--stalled-after-s", "1", "--json")
        kinds = {p["kind"] for p in json.loads(out)["problems"]}
        assert code == 1 and kinds == {"no_worker", "stalled"}
        code, out, _ = await _cli("check", *base, "--stalled-after-s", "1")
        assert "demo-mlp: no live worker" in out and "demo-mlp/interactive: stalled" in out
        # an open breaker
        module = Switchable()
        async with running_worker(redis_url, namespace=ns, handlers={"switch": switchable(module)},
                                  breaker_failures=1, breaker_cooldown_s=60, max_attempts=1):
            module.broken = True  # after the warm-up, which runs it too
            await client.submit("switch", X)

            async def breaker_seen() -> bool:
                code, out, _ = await _cli("check", *base, "-m", "switch")
                return code == 1 and "breaker" in out and "open" in out
            await _until(breaker_seen, 30)
    code, _, err = await _cli("check", "--broker", "redis://127.0.0.1:1/0")
    assert code == 1 and "Traceback" not in err and err.startswith("error: ")


async def test_cancel_from_the_shell_and_dlq_replay_dry_run_changes_nothing(
        redis_url: str) -> None:
    from tests.support.models import Switchable, switchable

    ns = "rc-cli"
    base = ("--broker", redis_url, "--namespace", ns)
    raw = redis_client(redis_url)
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        queued = await client.submit("demo-mlp", X)
        code, out, _ = await _cli("cancel", queued, "nope-1", *base)
        assert code == 4 and f"{queued}: cancelled" in out and "nope-1: unknown" in out
        code, out, _ = await _cli("cancel", queued, *base, "--json")
        assert code == 3 and json.loads(out)["outcome"] == "already_finished"

        module = Switchable()
        async with running_worker(redis_url, namespace=ns, handlers={"switch": switchable(module)},
                                  breaker_failures=1000, max_attempts=1):
            module.broken = True
            dead = await client.wait(await client.submit("switch", X), timeout=20)
        assert dead.status == "failed"
        before = {k: await raw.dump(k) for k in await raw.keys(f"{ns}:*")}
        code, out, err = await _cli("dlq", "replay", "--all", "--dry-run", *base)
        assert code == 0, err
        assert f"would replay {dead.request_id}" in out and "nothing changed" in out
        after = {k: await raw.dump(k) for k in await raw.keys(f"{ns}:*")}
        assert after == before  # test-only KEYS: proves the dry run wrote nothing
    await raw.aclose()


async def test_with_no_cancel_pending_batches_add_no_round_trip(redis_url: str) -> None:
    """The cancel set's size is read once a second on the side, whatever the number of
    batches; nothing per batch reads the set while it is empty."""
    ns = "rc-cost"
    raw = redis_client(redis_url)
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client, \
            running_worker(redis_url, namespace=ns, max_batch_size=4) as worker:
        await raw.config_resetstat()
        started = time.monotonic()
        for _ in range(10):  # ten rounds of small batches
            await client.wait_many(await client.submit_many("demo-mlp", [X] * 20), timeout=30)
        elapsed = time.monotonic() - started
        stats = await raw.info("commandstats")
        batches = worker.stats.batches
    assert batches >= 50
    assert stats.get("cmdstat_zcard", {}).get("calls", 0) <= elapsed / 1.0 + 2
    assert "cmdstat_zrem" not in stats  # the per-batch take never ran
    await raw.aclose()


async def test_cancel_on_either_transport_drops_the_request_unrun(fleet: Fleet) -> None:
    """Kafka cannot show what a worker holds, so there a pending request is always marked
    ``cancelled``; a worker that has not started it drops it unrun through the cancel set,
    as on Redis (a Kafka worker reads no record at a first delivery)."""
    async with fleet.client(check_model=False) as client:
        keep = await client.submit("demo-mlp", X)
        gone = await client.submit("demo-mlp", X)
        assert (await client.cancel(gone)).outcome == "cancelled"
        async with fleet.worker() as worker:
            assert (await client.wait(keep, timeout=60)).status == "succeeded"
            drop = worker.find(CancelledDrop)
            await _until(lambda: _true(drop.dropped == 1), 60)
            assert worker.stats.computed == 1 and worker.stats.duplicates == 0
        assert (await client.get(gone)).status == "cancelled"  # type: ignore[union-attr]


async def test_a_batch_dropped_whole_does_not_take_a_half_open_breakers_probe(
        redis_url: str) -> None:
    """The cancel check runs before the breakers: a half-open breaker's one probe goes to a
    batch that runs, so the breaker can close (taken by a dropped batch, it never would)."""
    from tests.support.models import Switchable, switchable

    ns = "rc-breaker"
    module = Switchable()
    async with running_worker(redis_url, namespace=ns, handlers={"switch": switchable(module)},
                              breaker_failures=1, breaker_cooldown_s=2.0, max_attempts=1
                              ) as worker, AsyncClient(redis_url, namespace=ns) as client:
        module.broken = True
        assert (await client.wait(await client.submit("switch", X), 20)).status == "failed"
        await asyncio.sleep(0.5)  # the open breaker has paused the lane by now
        queued = await client.submit("switch", X)
        assert (await client.cancel(queued)).outcome == "cancelled"
        await asyncio.sleep(1.2)  # the worker has seen the cancel set by now
        module.broken = False
        # half-open after the cooldown: the cancelled request's batch is dropped alone...
        drop = worker.find(CancelledDrop)
        await _until(lambda: _true(drop.dropped == 1))
        # ...and the next batch still gets the probe, which closes the breaker
        assert (await client.wait(await client.submit("switch", X), 20)).status == "succeeded"
        assert worker.stats.computed == 2


async def test_lane_purge_of_an_unknown_model_is_refused_not_reported_empty(
        redis_url: str) -> None:
    code, out, err = await _cli("lane", "purge", "no-such-model", "--yes", "--broker", redis_url)
    assert code == 2 and out == "", (out, err)  # refused, nothing purged (README exit codes)
    assert err.strip().splitlines() == [
        "error: no worker serves model 'no-such-model' (known models: none yet) and it is not "
        "declared; declare it with `batchfleet models declare no-such-model --input "
        "DTYPE[SHAPE]`, or start a worker with --model no-such-model"]
