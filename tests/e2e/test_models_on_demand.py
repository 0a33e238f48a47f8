"""Models loaded on demand within a budget (docs/models.md, "Loading on demand"), with a
real worker process and Redis: three models, room for two, traffic moving between them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors import open_control_plane
from batchfleet.producers import AsyncClient
from tests.support import s3 as s3_support
from tests.support.cli import run_cli
from tests.support.s3 import S3Server

pytestmark = pytest.mark.e2e
BATCHFLEET = (str(Path(sys.executable).with_name("batchfleet")),)
MODELS = ("a=demo-mlp", "b=demo-mlp:seed=2", "c=demo-mlp:seed=3")


@asynccontextmanager
async def _worker(redis_url: str, ns: str, *args: str,
                  env: dict[str, str] | None = None) -> AsyncIterator[list[str]]:
    """``batchfleet worker`` as a process; yields its log lines (kept up to date)."""
    proc = await asyncio.create_subprocess_exec(
        *BATCHFLEET, "worker", "--broker", redis_url, "--namespace", ns, "--device", "cpu",
        "--no-webhooks", "--log-format", "json", *args,
        env={**(env or os.environ), "PYTHONUNBUFFERED": "1"}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            lines.append(line.decode())

    reader = asyncio.create_task(read())
    try:
        for _ in range(1200):  # liveness only: start-up imports torch
            if any("worker ready" in line for line in lines) or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert any("worker ready" in line for line in lines), "".join(lines)[-3000:]
        yield lines
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await asyncio.wait_for(reader, 10)


def _events(lines: list[str], event: str) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            out.append(record)
    return out


async def test_three_models_with_room_for_two_and_traffic_moving_between_them(
        redis_url: str) -> None:
    """Every request succeeds exactly once (one attempt, no duplicate write); the heartbeat
    never reports more than two loaded; loads and evictions are counted; a cold model's
    requests wait in its lane, they never fail."""
    ns = "ondemand1"
    plane = open_control_plane(redis_url, namespace=ns)
    seen_loaded: list[list[str]] = []
    last: dict[str, Any] = {}
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            for beat in await plane.heartbeats.read_all():
                seen_loaded.append(list(beat.extra.get("loaded", [])))
                last.update(beat.extra, duplicates=beat.counters.get("duplicates", 0))
            await asyncio.sleep(0.05)

    phases = [("a", "b"), ("c",), ("a",), ("b", "c"), ("a", "c"), ("b",)]
    ids: dict[str, str] = {}
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        # the first phase is enqueued before the worker starts: cold from the first request
        for model in phases[0]:
            for i in range(5):
                ids[await client.submit(model, [float(i)] * 10)] = model
        args = [a for spec in MODELS for a in ("--model", spec)]
        async with _worker(redis_url, ns, *args, "--max-loaded-models", "2",
                           "--min-residency-s", "0.2") as lines:
            watcher = asyncio.create_task(watch())
            try:
                results = await client.wait_many(list(ids), timeout=60)
                for phase in phases[1:]:
                    batch = {}
                    for model in phase:
                        for i in range(5):
                            batch[await client.submit(model, [float(i)] * 10)] = model
                    ids.update(batch)
                    results += await client.wait_many(list(batch), timeout=60)
                await asyncio.sleep(2.5)  # one more beat, with the final counts
                code, out, err = await run_cli("models", "list", "-o", "json", "--broker",
                                               redis_url, "--namespace", ns)
                assert code == 0, err
                listed = {r["name"]: r for r in json.loads(out)}
            finally:
                stop.set()
                await watcher
    await plane.close()
    assert len(results) == len(ids) == 5 * sum(len(p) for p in phases)
    for result in results:
        assert result.status == "succeeded", result
        assert result.attempts == 1 and result.model == ids[result.request_id]
    assert seen_loaded and max(len(loaded) for loaded in seen_loaded) <= 2
    assert any(len(loaded) == 2 for loaded in seen_loaded)
    loads, evictions = _events(lines, "model loaded"), _events(lines, "model evicted")
    # a, b; then c evicts one; every later phase that needs the third evicts again
    assert len(loads) >= 4 and len(evictions) >= 2
    assert len(loads) - len(evictions) <= 2
    assert {e["model"] for e in loads} == {"a", "b", "c"}
    assert last["model_loads"] == len(loads) and last["model_evictions"] == len(evictions)
    assert last["duplicates"] == 0
    # ``models list``: where each model is loaded, as the last beat said
    held = {m for m, r in listed.items() if r["served"][0]["loaded"]}
    assert held == set(last["loaded"]) and len(held) <= 2 and set(listed) == {"a", "b", "c"}


SLOW_WARMUP = """\
import time
from pathlib import Path

import torch

LOG = Path(__file__).resolve().parent.parent / "calls.log"


class Slow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warmup = float(x.abs().sum()) == 0.0  # warm-up rows are zeros; requests are not
        with LOG.open("a") as f:
            f.write(f"{'warmup' if warmup else 'request'} {x.shape[0]}\\n")
        if warmup:
            time.sleep(0.7)
        return x.sum(dim=1, keepdim=True)


def build() -> torch.nn.Module:
    return Slow()
"""


async def test_a_version_is_not_reported_loaded_before_its_warm_up_ran(
        redis_url: str, tmp_path: Path) -> None:
    """While its warm-up batches (1, 8 and the max batch size) run, the heartbeat says
    ``loading``, not ``loaded``, and the request waits; it computes after every warm-up
    batch. The cold start is measured by phase."""
    import httpx

    from tests.support.shadow_cost import free_port

    (tmp_path / "slowmod").mkdir()
    (tmp_path / "slowmod" / "__init__.py").write_text(SLOW_WARMUP)
    log = tmp_path / "calls.log"
    ns, port = "ondemand2", free_port()
    plane = open_control_plane(redis_url, namespace=ns)
    seen: list[tuple[list[str], list[str], list[str]]] = []
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client:
        request = await client.submit("w", [1.0] * 4)
        async with _worker(redis_url, ns, "--model", "w=slowmod:build", "--input-spec",
                           "w=float32[4]", "--max-loaded-models", "1", "--app-dir",
                           str(tmp_path), "--metrics-port", str(port),
                           "--metrics-host", "127.0.0.1"):
            waiting = asyncio.create_task(client.wait(request, timeout=60))
            # until answered and a beat says loaded (liveness bound only)
            for _ in range(1200):
                if waiting.done() and any("w" in loaded for _, loaded, _ in seen):
                    break
                for beat in await plane.heartbeats.read_all():
                    calls = log.read_text().split("\n") if log.exists() else []
                    seen.append((beat.extra.get("loading", []), beat.extra.get("loaded", []),
                                 [c for c in calls if c]))
                await asyncio.sleep(0.05)
            result = await waiting
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    await plane.close()
    assert result.status == "succeeded" and result.attempts == 1, result
    assert any(loading == ["w"] and "w" not in loaded for loading, loaded, _ in seen), seen
    first_loaded = next(calls for _, loaded, calls in seen if "w" in loaded)
    assert first_loaded[:3] == ["warmup 1", "warmup 8", "warmup 64"], first_loaded
    assert log.read_text().split() == ["warmup", "1", "warmup", "8", "warmup", "64",
                                       "request", "1"]
    for phase in ("load", "warmup"):
        assert (f'batchfleet_model_cold_start_seconds_count{{model="w",phase="{phase}",'
                f'version="default"}} 1.0') in metrics
    assert 'batchfleet_model_loads_total{model="w",version="default"} 1.0' in metrics
    assert 'batchfleet_model_loaded{model="w",version="default"} 1.0' in metrics
    assert 'batchfleet_worker_up{model="w"} 1.0' in metrics


def _version(repo: Path, model: str, version: str, scale: float, ready: bool = True) -> None:
    """A version folder: a TorchScript model returning ``scale * sum(x)``, READY last."""
    import torch

    folder = repo / model / version
    folder.mkdir(parents=True)
    linear = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        linear.weight.fill_(scale)
    torch.jit.save(torch.jit.script(linear), str(folder / "model.pt"))
    np.save(folder / "sample.npy", np.ones(4, np.float32))  # model.toml's warmup_sample
    if ready:
        (folder / "READY").write_text("")
    else:  # half-written: the weights cut short, as a copy in progress leaves them
        data = (folder / "model.pt").read_bytes()
        (folder / "model.pt").write_bytes(data[: len(data) // 2])


async def _served(client: AsyncClient, model: str) -> tuple[str, float]:
    result = await client.wait(await client.submit(model, [1.0] * 4), timeout=60)
    assert result.status == "succeeded" and result.model_version, result
    return result.model_version.split("/")[1], float(result.outputs[0])  # type: ignore[index]


async def test_a_repository_serves_new_versions_without_a_restart_and_drains_removed_ones(
        redis_url: str, tmp_path: Path) -> None:
    """Version 2 added while the worker runs is served (no restart); a half-written
    version 3 (no READY) never is; a version that cannot load leaves 2 serving; version 2
    removed: 1 serves again; every version removed: the model is drained, its requests
    wait in the lane (not failed)."""
    import shutil

    repo = tmp_path / "repo"
    (repo / "lin").mkdir(parents=True)
    (repo / "lin" / "model.toml").write_text(
        'weights = "model.pt"\nwarmup_sample = "sample.npy"\ninput_spec = "float32[4]"\n'
        'cache_ttl_s = 0\n')
    _version(repo, "lin", "1", 1.0)
    ns = "repo1"
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client, \
            _worker(redis_url, ns, "--model-repository", str(repo),
                    "--repository-poll-s", "0.2") as lines:
        assert await _served(client, "lin") == ("1", 4.0)
        wrong = await client.wait(await client.submit("lin", [1.0] * 3), timeout=60)
        assert wrong.error is not None and wrong.error.type == "validation_error"
        _version(repo, "lin", "3", 3.0, ready=False)  # being written
        _version(repo, "lin", "2", 2.0)
        seen = set()
        for _ in range(200):  # liveness bound only
            served = await _served(client, "lin")
            seen.add(served)
            if served == ("2", 8.0):
                break
            await asyncio.sleep(0.05)
        assert ("2", 8.0) in seen and not any(v == "3" for v, _ in seen), seen
        for _ in range(100):  # ``models list``: where it came from (asserted every beat)
            code, out, err = await run_cli("models", "list", "-o", "json", "--broker",
                                           redis_url, "--namespace", ns)
            assert code == 0, err
            [record] = json.loads(out)
            if record["versions"]["default"].get("source", "").endswith("/lin/2"):
                break
            await asyncio.sleep(0.1)
        assert record["versions"]["default"]["source"] == f"{repo.resolve()}/lin/2"
        # a complete version that cannot load: logged, and version 2 keeps serving
        (repo / "lin" / "9").mkdir()
        (repo / "lin" / "9" / "model.pt").write_bytes(b"not a model")
        (repo / "lin" / "9" / "READY").write_text("")
        for _ in range(200):
            if any("cannot load a new model version" in line for line in lines):
                break
            await asyncio.sleep(0.05)
        assert await _served(client, "lin") == ("2", 8.0)
        shutil.rmtree(repo / "lin" / "9")
        shutil.rmtree(repo / "lin" / "2")
        for _ in range(200):
            if await _served(client, "lin") == ("1", 4.0):
                break
            await asyncio.sleep(0.05)
        assert await _served(client, "lin") == ("1", 4.0)
        shutil.rmtree(repo / "lin" / "1")
        await asyncio.sleep(1.0)  # a few polls: drained
        waiting = await client.submit("lin", [1.0] * 4)
        await asyncio.sleep(1.0)
        pending = await client.get(waiting)
        assert pending is None or pending.status == "pending", pending
    assert [e["version"] for e in _events(lines, "serving a new model version")] == ["2", "1"]
    assert len(_events(lines, "model left the repository: draining it; its requests wait "
                              "for a worker that has it")) == 1


async def test_across_workers_the_one_holding_a_model_reads_its_lane_first(
        redis_url: str) -> None:
    """Two workers that may each hold one model: the one that loads at once serves every
    request while the other (``--cold-load-after-ms 3000``) never loads the model; once
    the first is gone, the second loads it, but only after the lane's oldest request has
    waited that long, and the request still succeeds."""
    ns = "ondemand3"
    plane = open_control_plane(redis_url, namespace=ns)
    beats: dict[str, dict[str, Any]] = {}
    common = ("--model", "a=demo-mlp", "--max-loaded-models", "1")
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client, \
            _worker(redis_url, ns, *common, "--worker-id", "cold",
                    "--cold-load-after-ms", "3000"):
        async with _worker(redis_url, ns, *common, "--worker-id", "hot"):
            ids = []
            for i in range(20):
                ids.append(await client.submit("a", [float(i)] * 10))
                await asyncio.sleep(0.05)
            results = await client.wait_many(ids, timeout=60)
            await asyncio.sleep(2.5)  # a beat with the final counts
            for beat in await plane.heartbeats.read_all():
                beats[beat.worker_id] = {**beat.extra, **beat.counters}
        assert all(r.status == "succeeded" for r in results)
        assert beats["hot"]["succeeded"] == 20 and beats["hot"]["model_loads"] == 1
        assert beats["cold"]["succeeded"] == 0 and beats["cold"]["model_loads"] == 0
        late = await client.wait(await client.submit("a", [1.0] * 10), timeout=60)
    await plane.close()
    assert late.status == "succeeded", late
    assert late.started_at is not None and late.enqueued_at is not None
    assert late.started_at - late.enqueued_at >= 3.0  # it waited for the threshold


moto_s3 = s3_support.moto_s3  # the fixture, registered here by name
s3_server = s3_support.s3_server


async def test_an_s3_repository_serves_a_new_version_without_a_restart(
        redis_url: str, moto_s3: S3Server, tmp_path: Path) -> None:
    """The same repository on S3 (moto's server), reached through pyarrow with the AWS
    SDK's environment: version 1 served, version 2 uploaded (READY last) served next."""
    import pyarrow.fs as pafs

    local = tmp_path / "repo"
    (local / "lin").mkdir(parents=True)
    (local / "lin" / "model.toml").write_text('weights = "model.pt"\ninput_spec = "float32[4]"\n')
    _version(local, "lin", "1", 1.0)
    fs = moto_s3.filesystem()
    fs.create_dir("models")
    pafs.copy_files(str(local), "models/repo", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    ns = "repo-s3"
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client, \
            _worker(redis_url, ns, "--model-repository", "s3://models/repo",
                    "--repository-poll-s", "0.3", env=moto_s3.env()):
        assert await _served(client, "lin") == ("1", 4.0)
        _version(local, "lin", "2", 2.0)
        # the weights first, READY last
        pafs.copy_files(str(local / "lin" / "2" / "model.pt"), "models/repo/lin/2/model.pt",
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        await asyncio.sleep(1.0)  # several polls: a folder without READY is not loaded
        assert await _served(client, "lin") == ("1", 4.0)
        with fs.open_output_stream("models/repo/lin/2/READY"):
            pass
        for _ in range(200):  # liveness bound only
            if await _served(client, "lin") == ("2", 8.0):
                break
            await asyncio.sleep(0.05)
        assert await _served(client, "lin") == ("2", 8.0)


@pytest.mark.kafka
async def test_on_kafka_a_cold_models_partitions_are_paused_and_its_requests_wait(
        redis_url: str, kafka_broker: str) -> None:
    """Kafka: two models, room for one, traffic alternating; the unloaded model's
    partitions are paused, its requests wait (lag has no age: the wait runs from when
    the worker saw it) and every request succeeds once."""
    from batchfleet.workers.middleware.residency import ModelResidency
    from tests.support.transports import make_fleet

    fleet = make_fleet("kafka", redis_url, kafka_broker)
    async with fleet.client(check_model=False) as client, fleet.worker(
            models=("a=demo-mlp", "b=demo-mlp:seed=2"), max_loaded_models=1,
            min_residency_s=0.2, webhooks=False) as worker:
        residency = worker.find(ModelResidency)
        most = 0
        for model in ("a", "b", "a", "b"):
            ids = [await client.submit(model, [float(i)] * 10) for i in range(5)]
            waiting = asyncio.ensure_future(client.wait_many(ids, timeout=60))
            while not waiting.done():
                most = max(most, len(residency.serving()))
                await asyncio.sleep(0.02)
            results = waiting.result()
            assert all(r.status == "succeeded" and r.attempts == 1 and r.model == model
                       for r in results), results
    assert most == 1
    assert residency.loads == 4 and residency.evictions == 3


async def test_a_memory_budget_holds_what_fits(redis_url: str) -> None:
    """``--model-memory-mb`` with room for one demo-mlp (its parameters: 0.009 MiB): the
    two models take turns, never both loaded, every request answered once."""
    from batchfleet.workers.middleware.residency import ModelResidency
    from tests.support.transports import make_fleet

    fleet = make_fleet("redis", redis_url, None)
    async with fleet.client(check_model=False) as client, fleet.worker(
            models=("a=demo-mlp", "b=demo-mlp:seed=2"), model_memory_mb=0.015,
            min_residency_s=0.2, webhooks=False) as worker:
        residency = worker.find(ModelResidency)
        most = 0
        for model in ("a", "b", "a"):
            ids = [await client.submit(model, [float(i)] * 10) for i in range(5)]
            waiting = asyncio.ensure_future(client.wait_many(ids, timeout=60))
            while not waiting.done():
                most = max(most, len(residency.serving()))
                await asyncio.sleep(0.02)
            assert all(r.status == "succeeded" and r.attempts == 1 for r in waiting.result())
    assert most == 1 and residency.loads == 3 and residency.evictions == 2
    assert 0.005 < residency.memory_mb["a"] < 0.015


async def test_a_load_never_stalls_another_models_batches(
        redis_url: str, tmp_path: Path) -> None:
    """While one model warms up (0.7 s a warm-up batch, on the loader thread), another
    loaded model's requests are computed and answered: the load is still under way when
    they come back."""
    from batchfleet.schemas.per_model import PerModel
    from batchfleet.workers.middleware.residency import ModelResidency
    from tests.support.transports import make_fleet

    (tmp_path / "slowmod").mkdir()
    (tmp_path / "slowmod" / "__init__.py").write_text(SLOW_WARMUP)
    fleet = make_fleet("redis", redis_url, None)
    async with fleet.client(check_model=False) as client, fleet.worker(
            models=("a=demo-mlp", "w=slowmod:build"), max_loaded_models=2,
            input_spec=PerModel("", ((("w", None), "float32[4]"),)), app_dir=str(tmp_path),
            webhooks=False) as worker:
        residency = worker.find(ModelResidency)
        first = await client.wait(await client.submit("a", [0.5] * 10), timeout=60)
        assert first.status == "succeeded"
        slow = await client.submit("w", [1.0] * 4)
        for _ in range(1200):  # liveness bound only
            if residency.loading == "w":
                break
            await asyncio.sleep(0.01)
        assert residency.loading == "w"
        during = await client.wait_many(
            [await client.submit("a", [float(i)] * 10) for i in range(5)], timeout=60)
        assert residency.loading == "w", "the load finished first: nothing was shown"
        assert all(r.status == "succeeded" for r in during)
        assert (await client.wait(slow, timeout=60)).status == "succeeded"


async def test_a_repository_with_more_models_than_fit(redis_url: str, tmp_path: Path) -> None:
    """The repository's models loaded on demand: two models, room for one, traffic
    alternating; a version added to the model not loaded is what its next load serves."""
    repo = tmp_path / "repo"
    for model in ("p", "q"):
        (repo / model).mkdir(parents=True)
        (repo / model / "model.toml").write_text('weights = "model.pt"\n'
                                                 'input_spec = "float32[4]"\n')
        _version(repo, model, "1", 1.0)
    ns = "repo-ondemand"
    async with AsyncClient(redis_url, namespace=ns, check_model=False) as client, \
            _worker(redis_url, ns, "--model-repository", str(repo), "--repository-poll-s",
                    "0.2", "--max-loaded-models", "1", "--min-residency-s", "0.2") as lines:
        assert await _served(client, "p") == ("1", 4.0)
        assert await _served(client, "q") == ("1", 4.0)  # p evicted for it
        _version(repo, "p", "2", 2.0)
        await asyncio.sleep(1.0)  # a few polls: learnt while p is not loaded
        assert await _served(client, "p") == ("2", 8.0)
        assert await _served(client, "q") == ("1", 4.0)
    assert len(_events(lines, "model evicted")) >= 2
