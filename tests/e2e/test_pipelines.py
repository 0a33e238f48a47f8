"""Pipelines end to end on a real Redis and real workers: each step a queue hop on its
model's lane, the caller's request ID carrying the final result with ``steps``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.redis_plane import open_redis_control_plane
from batchfleet.schemas.pipeline import from_steps, from_toml
from batchfleet.schemas.registry import Declaration
from batchfleet.workers.models.builtin import build_mlp
from tests.e2e.test_webhooks import receiver, webhook_worker  # noqa: F401  (fixtures)
from tests.support.cli import run_cli
from tests.support.fleet import running_worker
from tests.support.models import POISON
from tests.support.pipeline_models import build_head, build_mix

pytestmark = pytest.mark.e2e
MODELS = ("mix=tests.support.pipeline_models:mix", "demo-mlp")


async def declare(url: str, ns: str, name: str, steps: str) -> None:
    plane = open_redis_control_plane(url, namespace=ns)
    try:
        for model in {s.partition("@")[0] for s in steps.split(",")}:
            await plane.models.declare(model, Declaration(0.0))
        await plane.pipelines.declare(from_steps(name, steps))
    finally:
        await plane.close()


def composed(rows: np.ndarray) -> np.ndarray:
    mix, mlp = build_mix(), build_mlp()
    with torch.no_grad():
        return mlp(mix(mix(torch.from_numpy(rows)))).numpy()  # type: ignore[no-any-return]


async def test_three_step_chain_equals_local_composition(redis_url: str) -> None:
    await declare(redis_url, "p3", "chain", "mix,mix,demo-mlp")
    rows = np.random.default_rng(29).random((2000, 10), dtype=np.float32)
    async with (running_worker(redis_url, models=MODELS, namespace="p3", max_wait_ms=5) as w,
                AsyncClient(redis_url, namespace="p3") as client):
        ids = await client.submit_many("chain", list(rows))
        results = await client.wait_many(ids, timeout=180)
        last = 'step="demo-mlp"} 2000.0'  # the caller's result is written before the
        for _ in range(100):              # last step's own: its count may lag a moment
            metrics = w.metrics.exposition().decode()
            if last in metrics:
                break
            await asyncio.sleep(0.05)
        code, out, err = await run_cli("pipelines", "status", "chain", "--broker", redis_url,
                                       "--namespace", "p3", "--json")
        shown = await run_cli("result", ids[0], "--show-steps", "--json", "--broker",
                              redis_url, "--namespace", "p3")
    assert shown[0] == 0, shown[2]
    steps_shown = json.loads(shown[1])["steps"]
    assert [s["step"] for s in steps_shown] == ["mix", "mix-2", "demo-mlp"]
    np.testing.assert_allclose(steps_shown[-1]["outputs"], composed(rows[:1])[0], rtol=1e-5)
    with torch.no_grad():  # each step's own output, kept under ID:STEP
        first = build_mix()(torch.from_numpy(rows[:1])).numpy()[0]
    np.testing.assert_allclose(steps_shown[0]["outputs"], first, rtol=1e-5, atol=1e-6)
    assert code == 0, err
    status = json.loads(out)
    for step in ("mix", "mix-2", "demo-mlp"):  # labelled by pipeline and step
        assert (f'batchfleet_pipeline_steps_total{{pipeline="chain",status="succeeded",'
                f'step="{step}"}} 2000.0') in metrics
    assert ('batchfleet_pipeline_results_total{pipeline="chain",status="succeeded"} 2000.0'
            in metrics)
    assert [(r["step"], r["model"], r["depth"], r["workers"]) for r in status] == [
        ("mix", "mix", 0, 1), ("mix-2", "mix", 0, 1), ("demo-mlp", "demo-mlp", 0, 1)]
    assert len(set(ids)) == 2000
    assert [r.status for r in results] == ["succeeded"] * 2000
    got = np.stack([np.asarray(r.outputs) for r in results])
    np.testing.assert_allclose(got, composed(rows), rtol=1e-5, atol=1e-6)
    for rid, r in zip(ids, results, strict=True):
        assert r.request_id == rid and r.model == "chain"
        assert [s["step"] for s in r.steps or []] == ["mix", "mix-2", "demo-mlp"]
        assert [s["model"] for s in r.steps or []] == ["mix", "mix", "demo-mlp"]
        assert all(s["attempts"] == 1 and s["model_version"] for s in r.steps or [])


FAILING = ("poison=tests.support.models:poison_model", "head=tests.support.pipeline_models:head")


async def test_a_failing_step_fails_only_its_requests_naming_the_step(redis_url: str) -> None:
    await declare(redis_url, "pf", "risky", "poison,head")
    rows = np.random.default_rng(3).random((60, 10), dtype=np.float32)
    bad = {4, 17, 42}
    for i in bad:
        rows[i, 0] = POISON
    async with (running_worker(redis_url, models=FAILING, namespace="pf", max_wait_ms=5,
                               max_attempts=2, retry_base_s=0.01, retry_cap_s=0.05),
                AsyncClient(redis_url, namespace="pf") as client):
        ids = await client.submit_many("risky", list(rows))
        results = await client.wait_many(ids, timeout=120)
    plane = open_redis_control_plane(redis_url, namespace="pf")
    try:
        letters = await plane.dead_letters.list("poison")
    finally:
        await plane.close()
    with torch.no_grad():
        want = build_head()(build_mlp()(torch.from_numpy(rows))).numpy()
    for i, r in enumerate(results):
        if i in bad:
            assert r.status == "failed" and r.error is not None
            assert r.error.message.startswith("step 'poison' (model poison): ")
            assert [s["step"] for s in r.steps or []] == ["poison"]
            assert (r.steps or [])[0]["attempts"] == 2
        else:
            assert r.status == "succeeded", r.error
            np.testing.assert_allclose(np.asarray(r.outputs), want[i], rtol=1e-5, atol=1e-6)
    # the dead letter is the step's, under the step's own ID
    assert sorted(x.request_id for x in letters) == sorted(f"{ids[i]}:poison" for i in bad)


async def test_one_deadline_spans_the_steps_and_cancel_stops_the_next_hop(
        redis_url: str) -> None:
    """Step 1 runs at once; step 2's workers start only after the deadline: the caller's
    result is expired, naming step 2. A caller cancelled before its first step ran never
    gets a later step. (Cancelled while step 1's worker ran, a slow machine let step 1
    finish and hand on first: a CI run saw it; cancel stops the *next* hop, not one
    already taken.)"""
    await declare(redis_url, "pd", "slow", "mix,demo-mlp")
    rows = np.random.default_rng(5).random((20, 10), dtype=np.float32)
    async with AsyncClient(redis_url, namespace="pd") as client:
        cancelled = await client.submit_many("slow", list(rows[10:]))
        await client.cancel_many(cancelled)
        async with running_worker(redis_url, models=(MODELS[0],), namespace="pd",
                                  max_wait_ms=5, worker_id="first"):
            timed = await client.submit_many("slow", list(rows[:10]), deadline_s=1.0)
            await asyncio.sleep(1.5)  # step 1 done long ago; the deadline has passed
        async with running_worker(redis_url, models=("demo-mlp",), namespace="pd",
                                  max_wait_ms=5, worker_id="second"):
            expired = await client.wait_many(timed, timeout=60)
            stopped = await client.wait_many(cancelled, timeout=60)
            await asyncio.sleep(0.5)
            steps = await client.wait_many([f"{rid}:demo-mlp" for rid in timed], timeout=30)
            never = [await client.get(f"{rid}:demo-mlp") for rid in cancelled]
    assert {r.status for r in expired} == {"expired"}
    assert all(r.error and r.error.message.startswith("step 'demo-mlp'") for r in expired)
    assert all([s["step"] for s in r.steps or []] == ["mix", "demo-mlp"] for r in expired)
    assert {s.status for s in steps} == {"expired"}
    assert {r.status for r in stopped} == {"cancelled"}
    assert never == [None] * 10  # the cancelled callers' second step was never enqueued


async def test_a_step_answered_by_its_fallback_marks_the_pipeline_result_degraded(
        redis_url: str) -> None:
    from batchfleet.schemas.per_model import parse_per_model
    from batchfleet.workers.fallback.chain import check_chain_text

    await declare(redis_url, "pg", "soft", "poison,head")
    rows = np.random.default_rng(9).random((20, 10), dtype=np.float32)
    rows[[2, 11], 0] = POISON
    chains = parse_per_model(("poison=value:[0.25]",), check_chain_text, "", "--fallback")
    async with (running_worker(redis_url, models=FAILING, namespace="pg", max_wait_ms=5,
                               max_attempts=1, fallback=chains, retry_base_s=0.01),
                AsyncClient(redis_url, namespace="pg") as client):
        results = await client.wait_many(await client.submit_many("soft", list(rows)), 60)
    with torch.no_grad():
        after = float(build_head()(torch.tensor([[0.25]])).item())
    for i, r in enumerate(results):
        assert r.status == "succeeded", r.error
        marks = [bool(s.get("degraded")) for s in r.steps or []]
        assert r.degraded is (i in (2, 11)) and marks == [i in (2, 11), False]
        if i in (2, 11):
            assert (r.steps or [])[0]["fallback"] == "value"
            np.testing.assert_allclose(np.asarray(r.outputs), [after], rtol=1e-5)


ENSEMBLE = """
[[step]]
name = "a"
model = "mix"
[[step]]
name = "b"
model = "mix2"
from = "input"
[[step]]
name = "avg"
join = "mean"
from = ["a", "b"]
"""


async def test_fan_out_and_mean_join_equal_the_local_computation(redis_url: str) -> None:
    plane = open_redis_control_plane(redis_url, namespace="pj")
    try:
        for model in ("mix", "mix2"):
            await plane.models.declare(model, Declaration(0.0))
        await plane.pipelines.declare(from_toml("ens", ENSEMBLE))
    finally:
        await plane.close()
    rows = np.random.default_rng(13).random((500, 10), dtype=np.float32)
    models = (MODELS[0], "mix2=tests.support.pipeline_models:mix2")
    async with (running_worker(redis_url, models=models, namespace="pj", max_wait_ms=5),
                AsyncClient(redis_url, namespace="pj") as client):
        ids = await client.submit_many("ens", list(rows))
        results = await client.wait_many(ids, timeout=120)
    with torch.no_grad():
        x = torch.from_numpy(rows)
        want = ((build_mix()(x) + build_mix(9)(x)) / 2).numpy()
    assert [r.status for r in results] == ["succeeded"] * 500
    np.testing.assert_allclose(np.stack([np.asarray(r.outputs) for r in results]), want,
                               rtol=1e-5, atol=1e-6)
    for r in results:
        assert sorted(s["step"] for s in r.steps or []) == ["a", "avg", "b"]
        assert (r.steps or [])[-1]["model"] == "join:mean"


def test_walkthrough_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    """docs/pipelines.md's walkthrough, with only the Redis URL changed."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    block = doc.split("<!-- walkthrough -->")[1].split("<!-- /walkthrough -->")[0]
    script = block.split("```bash\n")[1].split("```")[0].replace(
        "redis://127.0.0.1:6379/0", redis_url)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "succeeded ['demo-tokenize', 'demo-encoder']"
    assert "embed" in done.stdout  # pipelines list


async def test_bulk_run_scores_through_a_pipeline(redis_url: str, tmp_path: Path) -> None:
    await declare(redis_url, "pb", "chain2", "mix,demo-mlp")
    rows = np.random.default_rng(21).random((8, 10), dtype=np.float32)
    with (tmp_path / "in.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps({"inputs": row.tolist()}) + "\n")
    async with running_worker(redis_url, models=MODELS, namespace="pb", max_wait_ms=5):
        code, _, err = await run_cli("bulk", "run", "-m", "chain2", "-i",
                                     str(tmp_path / "in.jsonl"), "-o",
                                     str(tmp_path / "out.jsonl"), "--broker", redis_url,
                                     "--namespace", "pb", "--progress", "none", "--json")
    assert code == 0, err
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    with torch.no_grad():
        want = build_mlp()(build_mix()(torch.from_numpy(rows))).numpy()
    assert sorted(o["row"] for o in out) == list(range(8))
    assert all(o["status"] == "succeeded" for o in out)
    got = np.array([o["outputs"] for o in sorted(out, key=lambda o: o["row"])], np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


async def test_keep_intermediate_s_sets_how_long_the_earlier_steps_results_stay(
        redis_url: str) -> None:
    plane = open_redis_control_plane(redis_url, namespace="pi")
    try:
        for model in ("mix", "demo-mlp"):
            await plane.models.declare(model, Declaration(0.0))
        await plane.pipelines.declare(from_steps("kept", "mix,demo-mlp", 1000.0))
    finally:
        await plane.close()
    rows = np.random.default_rng(23).random((5, 10), dtype=np.float32)
    async with (running_worker(redis_url, models=MODELS, namespace="pi", max_wait_ms=5),
                AsyncClient(redis_url, namespace="pi") as client):
        ids = await client.submit_many("kept", list(rows))
        assert {r.status for r in await client.wait_many(ids, timeout=60)} == {"succeeded"}
    raw = redis_client(redis_url)
    try:
        kept = [await raw.ttl(f"pi:result:{rid}:mix") for rid in ids]
        last = [await raw.ttl(f"pi:result:{rid}:demo-mlp") for rid in ids]
    finally:
        await raw.aclose()
    assert all(900 < t <= 1000 for t in kept), kept
    assert all(t > 1000 for t in last), last  # the output step's: the result TTL


async def test_a_callback_url_gets_the_pipelines_result(
        redis_url: str, webhook_worker: Any, receiver: Any) -> None:  # noqa: F811
    from tests.e2e.test_gateway import NS
    from tests.e2e.test_webhooks import LOOPBACK

    await declare(redis_url, NS, "hooked", "mix,demo-mlp")
    receiver.start()
    row = np.random.default_rng(31).random(10, dtype=np.float32)
    async with (running_worker(redis_url, models=MODELS, namespace=NS, max_wait_ms=5),
                AsyncClient(redis_url, namespace=NS, callback_policy=LOOPBACK) as client):
        rid = await client.submit("hooked", row, callback_url=receiver.url)
        done = await client.wait(rid, timeout=30)
        got = await asyncio.to_thread(receiver.wait_for, 1, 30)
    body = json.loads(got[0].body)
    assert done.status == "succeeded" and len(got) == 1
    assert body["request_id"] == rid and body["model"] == "hooked"
    assert [s["step"] for s in body["steps"]] == ["mix", "demo-mlp"]
