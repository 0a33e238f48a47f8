"""docs/scaling.md's capacity model, held to Redis's own counters on a real fleet.

A real worker process and the SDK run against a fresh Redis; ``INFO commandstats`` and
the net byte counters are compared with the model's formulas (``bench.capacity``). The
bounds come from the formulas plus what an idle window of the same fleet did in the same
time (heartbeats, policy reads, idle fetches), never from a snapshot of a past run, and
nothing here is timed.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchfleet.bench.capacity import CapacityPlan
from batchfleet.bench.capacity_run import measure_capacity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Commands whose count the model gives exactly (background aside).
EXACT = ("evalsha", "hsetnx", "hset", "expire", "xadd", "hmget", "multi", "xack", "xdel",
         "exec", "info", "xlen")
#: Bytes per request may differ from the RESP arithmetic by this fraction.
BYTES_TOLERANCE = 0.25


def _slack(row: dict[str, Any]) -> float:
    """Room above the formula: twice what the idle fleet did in as long, plus a few
    (a heartbeat or registry read may land in the window the idle one missed)."""
    return 2.0 * float(row["background"]) + 5


def _check_commands(found: dict[str, Any]) -> None:
    rows = found["commands"]
    for command in EXACT:
        row = rows[command]
        assert row["predicted"] <= row["measured"] <= row["predicted"] + _slack(row), (
            command, row)
    for command in ("publish", "xreadgroup", "xclaim"):
        row = rows[command]
        assert row["predicted_low"] <= row["measured"] <= row["predicted_high"] + _slack(row), (
            command, row)


def _check_bytes(found: dict[str, Any]) -> None:
    for side, row in found["bytes_per_request"].items():
        assert abs(row["measured"] - row["predicted"]) <= BYTES_TOLERANCE * row["predicted"], (
            side, row)


def _check_reads(found: dict[str, Any]) -> None:
    """get(): one script call, one HMGET each; a wait on another client's IDs reads them
    once (one call per 2,000 IDs), since no announcement comes to it."""
    commands = found["reads"]["commands"]
    hmget = commands["hmget"]
    assert hmget["predicted"] <= hmget["measured"] <= hmget["predicted"] + 5, commands
    evalsha = commands["evalsha"]
    assert evalsha["predicted"] <= evalsha["measured"] <= evalsha["predicted"] + 5, commands


async def test_each_path_costs_what_the_model_says(redis_url: str) -> None:
    """One client, a backlog deep enough for full batches: submit costs 1 script call
    per 1,000-request chunk and 4 writes + 1 XADD per request; each batch 1 result
    script (1 PUBLISH, then XACK + XDEL; no MULTI/EXEC); waits on its own requests read nothing."""
    found = await measure_capacity(CapacityPlan(requests=3000, queued=1000,
                                                redis_url=redis_url))
    assert found["succeeded"] == found["requests"] == 3000
    _check_commands(found)
    _check_bytes(found)
    _check_reads(found)
    assert found["round_trips_per_request"]["read"] == 0
    # a record holds at least its body; a queued request its payload and pending body
    memory, sizes = found["memory_bytes"], found["sizes"]
    assert memory["per_result_memory_usage"] >= sizes["result"]
    assert memory["per_result_used_memory"] >= sizes["result"]
    assert memory["per_queued_request"] >= sizes["request"] + sizes["pending"]


async def test_small_batches_and_two_clients_follow_the_per_batch_formulas(
        redis_url: str) -> None:
    """Batches of 16 multiply the per-batch commands by 16 and still match; with two
    clients a batch announces once per client it holds requests of (K..2K PUBLISH)."""
    found = await measure_capacity(CapacityPlan(
        requests=2000, clients=2, max_batch_size=16, gets=10, foreign_waits=100, queued=0,
        redis_url=redis_url))
    assert found["succeeded"] == found["requests"] == 2000
    assert found["batches"] >= 2000 // 16
    _check_commands(found)
    _check_bytes(found)
    _check_reads(found)
