"""Graceful degradation (issue 26) against a real Redis and real workers: the ``error`` and
``breaker`` triggers, the ``value``, ``rules`` and ``model:`` steps, ``degrade="never"``,
DLQ replay of a degraded result, and the start-up refusals of the worker command."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchfleet.dlq import DeadLetterOps, Selection
from batchfleet.producers import AsyncClient
from batchfleet.schemas.per_model import parse_per_model
from batchfleet.workers.fallback.chain import check_chain_text, check_triggers_text
from tests.e2e.test_webhooks import receiver, webhook_worker  # noqa: F401  (fixtures)
from tests.support.cli import run_cli
from tests.support.fleet import running_worker
from tests.support.models import POISON, Switchable, demo_mlp, file_switched, switchable

pytestmark = pytest.mark.e2e
FAST = {"retry_base_s": 0.01, "retry_cap_s": 0.05}


def fallback(*entries: str) -> Any:
    return parse_per_model(entries, check_chain_text, "", "--fallback")


def degrade_on(*entries: str) -> Any:
    return parse_per_model(entries, check_triggers_text, "all", "--degrade-on")


def _rows(n: int, poison_at: list[int] = (), seed: int = 5) -> np.ndarray:  # type: ignore[assignment]
    rows = np.random.default_rng(seed).random((n, 10), dtype=np.float32)
    rows[list(poison_at), 0] = POISON
    return rows


async def _status_lane(redis_url: str, model: str, done: Callable[[Any], bool]) -> Any:
    """``status --json``'s interactive lane of ``model``, read again until ``done`` holds
    (the next heartbeat carries the counts)."""
    for _ in range(20):
        code, out, err = await run_cli("status", "--json", "--broker", redis_url)
        assert code == 0, err
        lane = next(x for x in json.loads(out)["lanes"]
                    if x["model"] == model and x["lane"] == "interactive")
        if done(lane):
            break
        await asyncio.sleep(0.5)
    return lane


async def test_error_a_failing_request_succeeds_degraded_with_its_error_kept_and_is_in_the_dlq(
        redis_url: str) -> None:
    poison_at = [3, 17, 40]
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              models=("switch",),
                              max_attempts=2, fallback=fallback("switch=value:[0.25]"),
                              **FAST) as worker, AsyncClient(redis_url) as client:
        ids = await client.submit_many("switch", _rows(60, poison_at))
        never = await client.submit_many("switch", _rows(4, [1], seed=6), degrade="never")
        results = await client.wait_many(ids + never, timeout=60)
        ops = DeadLetterOps(redis_url, None)
        try:
            letters = await ops.letters("switch")
        finally:
            await ops.close()
        vitals = worker.vitals()
        # each model's degraded share in `status` (and the console, which reads the same
        # snapshot): 3 degraded of 64 terminal results; the heartbeat carries it
        lane = await _status_lane(redis_url, "switch",
                                  lambda x: x["degraded_rate"] == round(3 / 64, 4))
    assert lane["degraded_rate"] == round(3 / 64, 4), lane
    assert vitals["model_stats"]["switch"]["degraded"] == 3
    for i, r in enumerate(results[:60]):
        assert r.status == "succeeded", (i, r)
        if i in poison_at:
            assert r.degraded and r.degraded_reason == "error" and r.fallback == "value"
            assert r.outputs is not None and r.outputs.tolist() == [0.25]
            assert r.outputs.dtype == np.float32 and r.model_version == ""
            assert r.error is None and r.degraded_error is not None
            assert r.degraded_error.type == "model_error"
            assert "dead-lettered after attempt 2" in r.degraded_error.message
        else:
            assert not r.degraded and r.fallback is None and r.model_version
    refused = results[61]
    assert refused.status == "failed" and refused.error is not None
    assert refused.error.type == "unavailable" and refused.error.retryable
    assert "error: model_error" in refused.error.message
    assert "degrade=never" in refused.error.message
    assert all(r.status == "succeeded" and not r.degraded for r in (results[60], *results[62:]))
    assert sorted(dl.request_id for dl in letters) == sorted([ids[i] for i in poison_at]
                                                             + [never[1]])
    assert vitals["degraded"] == {"switch:error": 3}


async def test_the_cli_submit_degrade_never_fails_closed_and_allow_takes_the_fallback(
        redis_url: str) -> None:
    """``batchfleet submit --degrade never|allow`` (the SDK's ``degrade=``)."""
    row = json.dumps(_rows(1, [0])[0].tolist())
    at = ("--broker", redis_url, "-m", "switch", "--inputs", row, "--dtype", "float32",
          "--wait", "30", "--json")
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              models=("switch",), max_attempts=1,
                              fallback=fallback("switch=value:[0.25]"), **FAST):
        never = await run_cli("submit", *at, "--degrade", "never")
        allow = await run_cli("submit", *at)
        bad = await run_cli("submit", *at, "--degrade", "sometimes")
    code, out, err = never
    assert code == 1, (out, err)
    body = json.loads(out)
    assert body["status"] == "failed" and body["error"]["type"] == "unavailable"
    assert "degrade=never" in body["error"]["message"]
    code, out, err = allow
    assert code == 0, (out, err)
    body = json.loads(out)
    assert body["status"] == "succeeded" and body["degraded"] is True
    assert body["outputs"] == [0.25]
    assert bad[0] == 2 and "--degrade 'sometimes'" in bad[2]


async def test_error_rules_and_model_steps_answer_in_order_and_a_failing_step_passes_on(
        redis_url: str) -> None:
    handlers = {"switch": switchable(Switchable()), "backup": demo_mlp()}
    chains = fallback("switch=rules:tests.support.fallback_rules:broken|"
                      "rules:tests.support.fallback_rules:score|value:[0.0]",
                      "backup=fail")
    async with running_worker(redis_url, handlers=handlers, models=tuple(handlers),
                              max_attempts=1, fallback=chains, **FAST), \
            AsyncClient(redis_url) as client:
        rows = _rows(20, [2, 9])
        results = await client.wait_many(await client.submit_many("switch", rows), timeout=60)
    for i in (2, 9):
        r = results[i]
        assert r.degraded and r.fallback == "rules:tests.support.fallback_rules:score"
        assert r.model_version == ""
        assert r.outputs is not None
        assert np.allclose(r.outputs, rows[i].mean(keepdims=True))  # this row's, no other's
    async with running_worker(redis_url, handlers=handlers, models=tuple(handlers),
                              max_attempts=1, **FAST,
                              fallback=fallback("switch=model:backup|value:[0.0]")), \
            AsyncClient(redis_url) as client:
        rows = _rows(10, [4], seed=8)
        ids = await client.submit_many("switch", rows)
        results = await client.wait_many(ids, timeout=60)
        direct = await client.wait_many(await client.submit_many("backup", rows[4:5]), 60)
    r = results[4]
    assert r.degraded and r.fallback == "model:backup"
    assert r.model_version == direct[0].model_version and r.model_version.startswith("default/")
    assert r.outputs is not None and np.array_equal(r.outputs, direct[0].outputs)


async def test_dlq_replay_reopens_a_degraded_result_under_a_new_generation(
        redis_url: str) -> None:
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              models=("switch",),
                              max_attempts=1, fallback=fallback("switch=value:[0.5]"),
                              **FAST), AsyncClient(redis_url) as client:
        model.broken = True
        [rid] = await client.submit_many("switch", _rows(1))
        first = await client.wait(rid, timeout=30)
        assert first.degraded and first.generation == 0
        model.broken = False
        ops = DeadLetterOps(redis_url, None)
        try:
            report = await ops.replay_selected(Selection(model="switch"))
        finally:
            await ops.close()
        assert report.replayed == [rid]
        for _ in range(200):
            again = await client.get(rid)
            if again is not None and again.status == "succeeded" and again.generation == 1:
                break
            await asyncio.sleep(0.05)
    assert again is not None and again.generation == 1 and not again.degraded
    assert again.outputs is not None and again.outputs.tolist() != [0.5]


async def test_without_a_chain_or_with_error_off_a_failure_is_unchanged(redis_url: str) -> None:
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              models=("switch",),
                              max_attempts=1, fallback=fallback("switch=value:[0.5]"),
                              degrade_on=degrade_on("switch=breaker"), **FAST), \
            AsyncClient(redis_url) as client:
        results = await client.wait_many(await client.submit_many("switch", _rows(8, [0])), 60)
    assert results[0].status == "failed" and not results[0].degraded
    assert results[0].error is not None and results[0].error.type == "model_error"


async def test_breaker_2000_requests_while_open_are_all_answered_degraded_at_once_then_heal(
        redis_url: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    handlers = {"flaky": file_switched(str(broken)), "backup": demo_mlp()}
    cooldown = 6.0
    async with running_worker(redis_url, handlers=handlers, models=tuple(handlers), max_attempts=1,
                              breaker_failures=2, breaker_cooldown_s=cooldown,
                              max_batch_size=64, fallback=fallback("flaky=model:backup"),
                              **FAST) as worker, AsyncClient(redis_url) as client:
        broken.touch()
        for i in range(50):  # a few requests fail until the breaker opens
            await client.wait_many(await client.submit_many("flaky", _rows(8, seed=i)), 30)
            if worker.guards.model.trips:
                break
        assert worker.guards.model.trips == 1
        opened = time.time()
        rows = _rows(2000, seed=99)
        ids = await client.submit_many("flaky", rows)
        results = await client.wait_many(ids, timeout=cooldown * 0.8)
        answered_by = time.time()
        assert worker.guards.model_states()["flaky"] == "open"
        assert len({r.request_id for r in results}) == 2000
        assert all(r.status == "succeeded" and r.degraded for r in results)
        assert {(r.degraded_reason, r.fallback) for r in results} == {("breaker",
                                                                       "model:backup")}
        assert all(r.degraded_error is not None and r.degraded_error.type == "breaker_open"
                   for r in results)
        assert answered_by - opened < cooldown  # none waited for the cool-down
        direct = await client.wait_many(await client.submit_many("backup", rows[:5]), 30)
        assert all(np.array_equal(a.outputs, b.outputs)
                   for a, b in zip(results[:5], direct, strict=True))
        assert worker.metrics.duplicates.labels("flaky")._value.get() == 0
        assert worker.vitals()["degraded_rps"] > 0  # the `status` column
        errors = worker.metrics.registry.get_sample_value(  # what the rollout guard counts
            "batchfleet_version_requests_total",
            {"model": "flaky", "version": "default", "role": "stable", "outcome": "error"})
        assert errors is not None and errors >= 2000
        assert worker.metrics.degraded.labels("flaky", "breaker",
                                              "model:backup")._value.get() == 2000
        broken.unlink()  # the model heals; the half-open probe closes the breaker
        healed = None
        for _ in range(int(cooldown * 20) + 100):
            [healed] = await client.wait_many(await client.submit_many("flaky", _rows(1)), 30)
            if not healed.degraded:
                break
            await asyncio.sleep(0.1)
        assert healed is not None and not healed.degraded and healed.fallback is None
        assert worker.guards.model_states()["flaky"] == "closed"
        later = await client.wait_many(await client.submit_many("flaky", _rows(50, seed=3)), 30)
    assert not any(r.degraded for r in later)


async def test_degraded_answers_never_enter_output_statistics_and_are_the_versions_errors(
        redis_url: str, tmp_path: Path) -> None:
    """Issue 27 <- 26: a fallback's answer is not the model's. It never enters the version's
    output statistics (``models outputs``) and counts as the version's error for the
    rollout guard, under the ``error`` trigger and with the breaker open alike."""
    from batchfleet.connectors.output_report import read_rows
    from batchfleet.workers.middleware.output_stats import OutputStats
    from batchfleet.workers.middleware.rollout_stats import VersionStats

    broken = tmp_path / "broken"
    async with running_worker(redis_url, handlers={"flaky": file_switched(str(broken))},
                              models=("flaky",), max_attempts=1, breaker_failures=2,
                              breaker_cooldown_s=120, stats_window_s=1,
                              fallback=fallback("flaky=value:[0.5]"), **FAST) as worker, \
            AsyncClient(redis_url) as client:
        healthy = await client.wait_many(await client.submit_many("flaky", _rows(30)), 30)
        assert not any(r.degraded for r in healthy)
        broken.touch()
        degraded = []
        for i in range(50):  # failed requests answered degraded until the breaker opens
            degraded += await client.wait_many(await client.submit_many(
                "flaky", _rows(8, seed=i)), 30)
            if worker.guards.model.trips:
                break
        assert worker.guards.model_states()["flaky"] == "open"
        held = await client.wait_many(await client.submit_many("flaky", _rows(100, seed=77)),
                                      30)
        assert {r.degraded_reason for r in held} == {"breaker"}
        degraded += held
        assert all(r.status == "succeeded" and r.degraded for r in degraded)
        assert {r.degraded_reason for r in degraded} == {"error", "breaker"}
        await worker.find(OutputStats).flush()
        await worker.find(VersionStats).flush()
        plane = worker.context.plane
        (row,) = await read_rows(plane, "flaky", 600)
        stats = (await plane.rollout_stats.read_versions("flaky", ["default"]))["default"]
    assert row.version == "default" and row.outputs.count == len(healthy)  # none degraded
    stable = stats.role("stable")
    assert stable.requests == len(healthy) + len(degraded)
    assert stable.errors == len(degraded)  # each one the version's error, once


@pytest.mark.parametrize(("flag", "says"), [
    ("demo-mlp=model:ghost", "--fallback demo-mlp=model:ghost: this worker does not hold"),
    ("demo-mlp=rules:no_such_mod:f", "cannot import 'no_such_mod'"),
    ("demo-mlp=value:[0.5,0.5]", "shape [2] differs from the model's output shape [1]"),
    ("demo-mlp=valu:[1]", "unknown step"),
])
async def test_the_worker_refuses_a_chain_it_cannot_run_in_one_line(
        redis_url: str, flag: str, says: str) -> None:
    code, out, err = await run_cli("worker", "--broker", redis_url, "--model", "demo-mlp",
                                   "--device", "cpu", "--fallback", flag, "--no-webhooks",
                                   timeout_s=90)
    assert code == 2, (code, out, err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], err


async def test_bulk_rows_carry_the_marks_the_summary_counts_them_and_never_fails_closed(
        redis_url: str, tmp_path: Path) -> None:
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    from batchfleet.producers.bulk import Endpoints, JobSpec, Tuning, run_job
    from tests.support.bulk_main import read_jsonl, write_jsonl

    x = _rows(40, [5, 30])
    write_jsonl(tmp_path / "in.jsonl", x)
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              models=("switch",), max_attempts=1,
                              fallback=fallback("switch=value:[0.5]"), **FAST):
        allow = await run_job(JobSpec.create("dg-1", "switch", tmp_path / "in.jsonl",
                                             tmp_path / "out.jsonl"), Endpoints(redis_url))
        never_spec = JobSpec.create("dg-2", "switch", tmp_path / "in.jsonl",
                                    tmp_path / "never.jsonl")
        never = await run_job(never_spec, Endpoints(redis_url), tuning=Tuning(degrade="never"))
        # Parquet rows carry the same marks, as columns (null where not degraded)
        pq.write_table(pa.table({"inputs": pa.array(x.tolist(), type=pa.list_(pa.float32()))}),
                       tmp_path / "in.parquet")
        pq_spec = JobSpec.create("dg-3", "switch", tmp_path / "in.parquet",
                                 tmp_path / "out.parquet")
        closed = await run_job(pq_spec, Endpoints(redis_url), tuning=Tuning(degrade="never"))
        assert closed.failed == 2
        before = pq.read_table(tmp_path / "out.parquet").to_pylist()
        assert [r["row"] for r in before if r["status"] == "failed"] == [5, 30]
        assert not any(r["degraded"] for r in before)
        # --retry-failed rewrites the failed rows in place, the marks with them
        marked = await run_job(pq_spec, Endpoints(redis_url), retry_failed=True)
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert marked.failed == 0 and len(table) == 40
    for row in table:
        if row["row"] in (5, 30):
            assert row["degraded"] is True and row["degraded_reason"] == "error"
            assert row["fallback"] == "value" and row["outputs"] == [0.5]
            assert row["degraded_error"]["type"] == "model_error"
            assert row["degraded_error"]["retryable"] is True
        else:
            assert row["status"] == "succeeded" and row["degraded"] is False
            assert (row["degraded_reason"], row["fallback"], row["degraded_error"]) == (
                None, None, None)
    out = read_jsonl(tmp_path / "out.jsonl")
    assert allow.succeeded == 40 and allow.degraded == 2 and allow.failed == 0
    for row in out:
        if row["row"] in (5, 30):
            assert row["degraded"] is True and row["degraded_reason"] == "error"
            assert row["fallback"] == "value" and row["outputs"] == [0.5]
            assert row["degraded_error"]["type"] == "model_error"
        else:
            assert "degraded" not in row
    assert never.succeeded == 38 and never.failed == 2 and never.degraded == 0
    errors = read_jsonl(never_spec.errors)
    assert [e["row"] for e in errors] == [5, 30]
    assert {e["error"]["type"] for e in errors} == {"unavailable"}


@pytest.mark.kafka
async def test_kafka_error_then_breaker_requests_are_answered_degraded_and_the_lane_drains(
        redis_url: str, kafka_broker: str, tmp_path: Path) -> None:
    """Kafka parity, one test for both triggers (a group join costs seconds): failures
    after retries are degraded (``error``), then the open breaker keeps the partitions
    unpaused and answers from the chain (``breaker``)."""
    from tests.support.transports import make_fleet

    fleet = make_fleet("kafka", redis_url, kafka_broker)
    broken = tmp_path / "broken"
    handlers = {"flaky": file_switched(str(broken)), "backup": demo_mlp()}
    async with fleet.worker(handlers=handlers, models=tuple(handlers), max_attempts=1,
                            breaker_failures=2, breaker_cooldown_s=30.0, max_batch_size=32,
                            fallback=fallback("flaky=model:backup"), **FAST) as worker, \
            fleet.client() as client:
        broken.touch()
        first = await client.wait_many(await client.submit_many("flaky", _rows(8)), 60)
        assert all(r.degraded and r.degraded_reason == "error" for r in first)
        while not worker.guards.model.trips:
            await client.wait_many(await client.submit_many("flaky", _rows(8, seed=1)), 60)
        ids = await client.submit_many("flaky", _rows(300, seed=2))
        results = await client.wait_many(ids, timeout=25)  # well inside the 30 s cool-down
        assert worker.guards.model_states()["flaky"] == "open"
    assert len({r.request_id for r in results}) == 300
    assert all(r.status == "succeeded" and r.degraded and r.degraded_reason == "breaker"
               and r.fallback == "model:backup" for r in results)
    assert first[0].degraded_error is not None and first[0].degraded_error.type == "model_error"


async def test_cache_step_answers_each_input_with_its_own_stored_output_and_stale_only_as_fallback(
        redis_url: str) -> None:
    """The version-free entry is exactly the output computed for the same input bytes,
    names the version that computed it, and outlives --cache-ttl-s (by --cache-stale-s)
    only for fallback answers."""
    from batchfleet.workers.per_model import PerModel

    model = Switchable()
    rows = _rows(12, seed=11)
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              models=("switch",), max_attempts=1, **FAST,
                              cache_ttl_s=PerModel(1), cache_stale_s=PerModel(60),
                              fallback=fallback("switch=cache|value:[-1.0]")), \
            AsyncClient(redis_url) as client:
        first = await client.wait_many(await client.submit_many("switch", rows[:8]), 30)
        assert not any(r.degraded or r.cached for r in first)
        await asyncio.sleep(1.5)  # past the freshness TTL: no longer a cache hit
        again = await client.wait_many(await client.submit_many("switch", rows[:2]), 30)
        assert not any(r.cached or r.degraded for r in again)  # stale is never served fresh
        model.broken = True
        mixed = np.concatenate([rows[2:8][::-1], rows[8:]])  # stored ones reversed, and new
        results = await client.wait_many(await client.submit_many("switch", mixed), 30)
    for row, r in zip(mixed, results, strict=True):
        assert r.status == "succeeded" and r.degraded and r.degraded_reason == "error"
        stored = [f for f, x in zip(first, rows[:8], strict=True) if np.array_equal(x, row)]
        if stored:
            assert r.fallback == "cache" and np.array_equal(r.outputs, stored[0].outputs)
            assert r.model_version == stored[0].model_version != ""
        else:
            assert r.fallback == "value" and r.outputs.tolist() == [-1.0]


async def test_cache_step_never_answers_one_owner_with_anothers_entry_and_reads_per_version_scope(
        redis_url: str) -> None:
    """Under owner scope (the default) an entry alice's request stored never answers bob's
    same input, while it answers alice's; with ``--cache-scope switch@default=shared`` the
    step reads where that version's writes went (shared), so bob's is answered from it."""
    from batchfleet.connectors.result_cache import SCOPE_OWNER, SCOPE_SHARED
    from batchfleet.schemas.registry import DEFAULT_LABEL
    from batchfleet.workers.per_model import PerModel

    by_scope = {}
    for seed, scope in ((13, PerModel(SCOPE_OWNER)),
                        (14, PerModel(SCOPE_OWNER, ((("switch", DEFAULT_LABEL), SCOPE_SHARED),)))):
        rows = _rows(4, seed=seed)  # inputs of their own: the first run's entries stay
        model = Switchable()
        async with running_worker(redis_url, handlers={"switch": switchable(model)},
                                  models=("switch",), max_attempts=1, **FAST,
                                  cache_ttl_s=PerModel(1), cache_stale_s=PerModel(60),
                                  cache_scope=scope,
                                  fallback=fallback("switch=cache|value:[-1.0]")) as worker, \
                AsyncClient(redis_url) as client:
            assert list(worker.context.versions["switch"]) == [DEFAULT_LABEL]
            stored = await client.wait_many(
                await client.submit_many("switch", rows, owner="alice"), 30)
            assert not any(r.degraded or r.cached for r in stored)
            await asyncio.sleep(1.5)  # past the freshness TTL: only the fallback reads them
            model.broken = True
            bob = await client.wait_many(
                await client.submit_many("switch", rows[:2], owner="bob"), 30)
            alice = await client.wait_many(
                await client.submit_many("switch", rows[2:], owner="alice"), 30)
        assert all(r.degraded and r.fallback == "cache" for r in alice)
        assert [np.asarray(r.outputs).tolist() for r in alice] == [
            np.asarray(r.outputs).tolist() for r in stored[2:]]
        by_scope[scope.overrides != ()] = [r.fallback for r in bob]
    assert by_scope[False] == ["value", "value"]  # owner scope: never alice's entry
    assert by_scope[True] == ["cache", "cache"]  # shared for this version: read where written


async def test_deadline_requests_are_answered_degraded_before_their_deadline_or_expire_if_never(
        redis_url: str) -> None:
    from tests.support.models import paced

    async with running_worker(redis_url, handlers={"slow": paced(0.2)}, models=("slow",),
                              max_batch_size=4, max_wait_ms=1.0,
                              fallback=fallback("slow=value:[0.5]")) as worker, \
            AsyncClient(redis_url) as client:
        # teach the cost model (0.2 s a batch) with requests that have no deadline
        await client.wait_many(await client.submit_many("slow", _rows(8)), 30)
        ids = await client.submit_many("slow", _rows(24, seed=3), deadline_s=0.6)
        results = await client.wait_many(ids, timeout=30)
        never = await client.wait_many(await client.submit_many(
            "slow", _rows(24, seed=3), deadline_s=0.6, degrade="never"), timeout=30)
        counts = worker.vitals()["degraded"]
    assert all(r.status == "succeeded" for r in results)
    degraded = [r for r in results if r.degraded]
    assert 0 < len(degraded) < 24 and counts.get("slow:deadline", 0) >= len(degraded)
    for r in degraded:
        assert r.degraded_reason == "deadline" and r.fallback == "value"
        assert r.degraded_error is not None and r.degraded_error.type == "deadline_exceeded"
        assert r.finished_at is not None and r.finished_at < r.enqueued_at + 0.6  # in time
    assert not any(r.degraded for r in never)
    assert {r.status for r in never} == {"succeeded", "expired"}  # as today


async def test_overload_a_backlog_past_shed_after_ms_is_answered_by_cheap_steps_and_drains(
        redis_url: str) -> None:
    from batchfleet.workers.per_model import PerModel
    from tests.support.models import paced

    handlers = {"slow": paced(0.1), "backup": demo_mlp()}
    async with running_worker(redis_url, handlers=handlers, models=tuple(handlers),
                              max_batch_size=8, shed_after_ms=PerModel(300.0),
                              fallback=fallback("slow=model:backup|value:[0.5]",
                                                "backup=fail")) as worker, \
            AsyncClient(redis_url) as client:
        ids = await client.submit_many("slow", _rows(400, seed=4))
        results = await client.wait_many(ids, timeout=60)
        assert worker.stats.computed < 400  # the shed ones never ran the model
    shed = [r for r in results if r.degraded]
    assert all(r.status == "succeeded" for r in results) and len(results) == 400
    assert shed and all(r.degraded_reason == "overload" and r.fallback == "value"
                        for r in shed)  # cheap steps only: never the model:backup step
    assert all(r.finished_at is not None and r.finished_at - r.enqueued_at > 0.3
               for r in shed)  # only requests past the mark were shed


async def test_http_carries_the_marks_and_the_degrade_field_fails_closed(
        redis_url: str) -> None:
    import httpx

    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.producers.gateway import GatewaySettings, KeyRing, hash_key
    from tests.support.gateway_main import live_gateway

    ns, key = "gwdg", "bfk_degrade_all"
    gateway = GatewaySettings(broker=redis_url, namespace=ns,
                              keys=KeyRing.parse(f"all:{hash_key(key)}:*"),
                              callback_policy=CallbackPolicy.parse("http,https", "",
                                                                   "127.0.0.0/8"))
    poison = [POISON] + [0.5] * 9
    async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                              models=("switch",), namespace=ns, max_attempts=1,
                              fallback=fallback("switch=value:[0.25]"), **FAST):
        with live_gateway(gateway) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30,
                                         headers={"X-API-Key": key}) as http:
                allow = await http.post("/v1/models/switch/requests", json={"inputs": poison})
                never = await http.post("/v1/models/switch/requests",
                                        json={"inputs": poison, "degrade": "never"})
                bad = await http.post("/v1/models/switch/requests",
                                      json={"inputs": poison, "degrade": "maybe"})
                got = [(await http.get(r.headers["Location"], params={"wait": 20})).json()
                       for r in (allow, never)]
    assert bad.status_code == 422 and "degrade" in bad.text
    assert got[0]["status"] == "succeeded" and got[0]["degraded"] is True
    assert got[0]["degraded_reason"] == "error" and got[0]["fallback"] == "value"
    assert got[0]["outputs"] == [0.25] and got[0]["error"] is None
    assert got[0]["degraded_error"]["type"] == "model_error"
    assert got[1]["status"] == "failed" and got[1]["error"]["type"] == "unavailable"
    assert got[1]["degraded"] is False


async def test_a_degraded_result_is_sent_by_webhook_and_its_replay_sends_the_models_answer(
        redis_url: str, webhook_worker: Any, receiver: Any) -> None:  # noqa: F811
    import json

    from tests.e2e.test_webhooks import LOOPBACK, NS

    receiver.start()
    model = Switchable()
    async with running_worker(redis_url, handlers={"switch": switchable(model)},
                              models=("switch",), namespace=NS, max_attempts=1,
                              webhook_retry_intervals=(1, 1, 1),
                              fallback=fallback("switch=value:[0.5]"), **FAST), \
            AsyncClient(redis_url, namespace=NS, callback_policy=LOOPBACK) as client:
        model.broken = True
        rid = await client.submit("switch", _rows(1)[0], callback_url=receiver.url)
        first = await client.wait(rid, timeout=30)
        await asyncio.to_thread(receiver.wait_for, 1, 30)
        model.broken = False
        ops = DeadLetterOps(redis_url, None, namespace=NS)
        try:
            assert (await ops.replay_selected(Selection(model="switch"))).replayed == [rid]
        finally:
            await ops.close()
        got = await asyncio.to_thread(receiver.wait_for, 2, 30)
    bodies = [json.loads(d.body) for d in got]
    assert first.degraded and bodies[0]["degraded"] is True and bodies[0]["generation"] == 0
    assert bodies[1]["request_id"] == rid and bodies[1]["generation"] == 1
    assert bodies[1]["degraded"] is False and bodies[1]["outputs"] != [0.5]


async def test_one_log_line_when_a_trigger_starts_and_one_when_it_ends_never_per_request(
        redis_url: str) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with running_worker(redis_url, handlers={"switch": switchable(Switchable())},
                                  models=("switch",), max_attempts=1, max_batch_size=64,
                                  fallback=fallback("switch=value:[0.5]"), **FAST), \
                AsyncClient(redis_url) as client:
            poisoned = await client.wait_many(await client.submit_many(
                "switch", _rows(200, list(range(5, 200, 20)))), 30)
            clean = await client.wait_many(await client.submit_many("switch", _rows(8)), 30)
    assert sum(r.degraded for r in poisoned) == 10 and not any(r.degraded for r in clean)
    started = [e for e in logs if e.get("event", "").startswith("degradation started")]
    ended = [e for e in logs if e.get("event", "").startswith("degradation ended")]
    # an episode runs from a degraded answer to the next batch the model answers whole:
    # lines per episode, never per request, and every episode closed by the clean batch
    assert 1 <= len(started) == len(ended) < 10
    assert {e["reason"] for e in started + ended} == {"error"}
    assert sum(e["degraded"] for e in ended) == 10
