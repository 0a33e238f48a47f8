"""``batchfleet status`` against a live fleet: a real worker, real Redis (and Kafka)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors import BrokerURL
from batchfleet.connectors.fleet import FleetReader
from batchfleet.connectors.urls import results_url_for
from batchfleet.status import FleetSnapshot, LaneView
from tests.support.models import Switchable, switchable
from tests.support.transports import Fleet

pytestmark = pytest.mark.e2e

MODEL = "switch"


def _reader(fleet: Fleet) -> FleetReader:
    broker = BrokerURL.parse(fleet.broker)
    return FleetReader(broker, results_url_for(broker, fleet.results), fleet.names)


async def _until(reader: FleetReader, done: Callable[[FleetSnapshot], bool],
                 timeout_s: float = 20.0) -> FleetSnapshot:
    deadline = time.monotonic() + timeout_s
    while True:
        snap = await reader.read()
        if done(snap) or time.monotonic() > deadline:
            return snap
        await asyncio.sleep(0.2)


def _lane(snap: FleetSnapshot | dict[str, Any], lane: str = "interactive",
          model: str = MODEL) -> Any:
    lanes = snap["lanes"] if isinstance(snap, dict) else [_as_dict(x) for x in snap.lanes]
    return next(x for x in lanes if x["model"] == model and x["lane"] == lane)


def _as_dict(lane: LaneView) -> dict[str, Any]:
    return {k: getattr(lane, k) for k in LaneView.__dataclass_fields__}


async def _cli(*args: str) -> tuple[int, str, str]:
    """``batchfleet status`` in a child process, while this loop keeps the worker running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", "status", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


def _args(fleet: Fleet) -> list[str]:
    return ["--broker", fleet.broker, "--results", fleet.results, "--namespace", fleet.namespace]


async def test_status_shows_throughput_then_a_stalled_lane_with_its_dlq_and_open_breaker(
        fleet: Fleet) -> None:
    model = Switchable()
    reader = _reader(fleet)
    try:
        async with fleet.worker(handlers={MODEL: switchable(model)}, sample_every_s=0.2,
                                max_attempts=1, breaker_failures=2, breaker_cooldown_s=600,
                                max_batch_size=16) as worker, fleet.client() as client:
            # 1. traffic for ~4 s: the heartbeats carry throughput and p99
            async def produce() -> list[str]:
                ids: list[str] = []
                for _ in range(40):
                    ids += await client.submit_many(MODEL, np.random.rand(25, 10)
                                                    .astype(np.float32))
                    await asyncio.sleep(0.1)
                return ids

            producer = asyncio.create_task(produce())
            busy = await _until(reader, lambda s: s.throughput_rps > 0 and
                                _lane(s)["p99_ms"] is not None)
            results = await client.wait_many(await producer, timeout=60)
            assert {r.status for r in results} == {"succeeded"}
            assert busy.throughput_rps > 0 and _lane(busy)["p99_ms"] > 0
            assert [w.worker_id for w in busy.workers] == [worker.settings.worker_id]

            # 2. the model breaks: two failed batches open its breaker, both go to the DLQ
            model.broken = True
            for _ in range(2):
                rid = await client.submit(MODEL, np.zeros(10, np.float32))
                assert (await client.wait(rid, timeout=30)).status == "failed"
            assert worker.guards.model.trips == 1
            # 3. the worker stops pulling, so new requests wait on the lane
            await client.submit_many(MODEL, np.random.rand(30, 10).astype(np.float32))
            await _until(reader, lambda s: _lane(s)["depth"] == 30 and
                         _lane(s)["breakers"].get("model") == {"open": 1})
            code, out, err = await _cli(*_args(fleet), "--json")
    finally:
        await reader.close()
    assert code == 0, err
    snap = json.loads(out)
    lane = _lane(snap)
    assert lane["depth"] == 30
    assert lane["dlq"] == 2 and lane["workers"] == 1
    assert lane["breakers"] == {"model": {"open": 1}, "result_store": {"closed": 1}}
    assert lane["time_to_drain_s"] is None  # its only worker's breaker is open
    assert _lane(snap, "bulk")["depth"] == 0
    (only,) = snap["workers"]
    if fleet.kind == "redis":  # read from the stream itself
        # delivered to the worker (which holds them until the breaker lets it compute) or
        # not; a fetch already blocked when the breaker opened may take them all, up to
        # the worker's fetch capacity (max_batch_size x prefetch_batches = 16 x 2)
        assert lane["lag"] + lane["pending"] == 30 and lane["pending"] <= 32
        assert lane["oldest_age_s"] > 0
    else:
        assert lane["lag"] == 30 and lane["pending"] is None
    assert only["models"] == [MODEL] and only["breakers"]["model"] == "open"
    assert only["counters"]["succeeded"] == 1000 and only["counters"]["dead_lettered"] == 2
    # issue 30: the model's own batch size and error share, from its per-model counters
    assert only["model_stats"][MODEL]["succeeded"] == 1000
    assert only["model_stats"][MODEL]["failed"] == 2
    assert lane["error_rate"] == round(2 / 1002, 4) and lane["degraded_rate"] is None
    stats = only["model_stats"][MODEL]
    assert lane["mean_batch_size"] == round(stats["rows"] / stats["batches"], 2) > 1
    assert snap["totals"] == {"workers": 1, "throughput_rps": snap["totals"]["throughput_rps"],
                              "depth": 30, "dlq": 2, "undecodable": 0, "retry_scheduled": 0}


async def test_the_table_and_a_fleet_with_no_live_workers(redis_url: str) -> None:
    from tests.support.transports import make_fleet

    fleet = make_fleet("redis", redis_url, None)
    async with fleet.worker(models=("demo-mlp",)):
        pass  # registered its model, then stopped: its heartbeat is gone
    async with fleet.client() as client:
        await client.submit_many("demo-mlp", np.zeros((7, 10), np.float32))
    code, out, err = await _cli(*_args(fleet), "--json")
    assert code == 0, err
    snap = json.loads(out)
    assert snap["workers"] == []
    lane = _lane(snap, model="demo-mlp")
    assert lane["depth"] == 7 and lane["lag"] == 7 and lane["workers"] == 0
    code, out, err = await _cli(*_args(fleet), "--once")
    assert code == 0, err
    assert "demo-mlp" in out and "interactive" in out and "no live workers" in out


async def test_watch_json_prints_one_snapshot_per_interval(redis_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", "status", "--broker", redis_url,
        "--json", "--watch", "--interval", "0.3", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        lines = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                 for _ in range(3)]
    finally:
        proc.terminate()
        await proc.wait()
    assert [line["totals"]["workers"] for line in lines] == [0, 0, 0]
    assert lines[0]["taken_at"] < lines[1]["taken_at"] < lines[2]["taken_at"]


async def test_an_unreachable_redis_fails_with_a_message() -> None:
    code, _, err = await _cli("--broker", "redis://127.0.0.1:1/0", "--json")
    assert code == 1 and "cannot read the fleet" in err
