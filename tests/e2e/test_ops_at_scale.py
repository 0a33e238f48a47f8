"""Ops commands cost the same at a million keys as at ten (issue 18, "Indexes, not scans").

A real Redis is filled with synthetic result keys (200k here, 1M with
``BATCHFLEET_TEST_BIG=1``); ``status --json`` and ``dlq list`` run as the real CLI
before and after, and ``INFO commandstats`` shows which commands each issued. The
counts must match exactly and hold no SCAN or KEYS: a constant number of round
trips, whatever the keyspace holds. The wall times are printed, never asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import redis

from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Result, encode_result
from batchfleet.schemas.names import Names
from tests.support.fleet import running_worker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BIG = os.environ.get("BATCHFLEET_TEST_BIG") == "1"
KEYS = 1_000_000 if BIG else 200_000
CHUNK = 10_000
COMMANDS = {"status": ["status", "--json"], "dlq list": ["dlq", "list", "--json"]}


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def run_counted(client: redis.Redis, url: str, args: list[str]) -> tuple[dict[str, int], float]:
    """The commands one CLI run issued (by name, INFO's own excluded), and its wall time."""
    before = command_counts(client)
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "batchfleet", *args, "--broker", url],
                          check=False, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - began
    assert proc.returncode == 0, proc.stderr
    after = command_counts(client)
    delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    delta.pop("info", None)
    return delta, wall


def populate(client: redis.Redis, names: Names, n: int) -> None:
    """``n`` terminal result hashes, as a day of traffic leaves them, pipelined in chunks."""
    body = encode_result(Result("x", "succeeded", model="demo-mlp"))
    for start in range(0, n, CHUNK):
        with client.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + CHUNK)):
                pipe.hset(names.result(f"synthetic-{i}"), mapping={"status": "succeeded",
                                                                    "body": body})
            pipe.execute()


async def test_status_and_dlq_list_issue_the_same_commands_at_any_keyspace_size(
        redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    names = Names()
    try:
        # a fleet that has run: a model served, its lanes, a result
        async with running_worker(redis_url), AsyncClient(redis_url) as sdk:
            rid = await sdk.submit("demo-mlp", np.ones(10, np.float32))
            assert (await sdk.wait(rid, timeout=30)).ok
        small = {name: run_counted(client, redis_url, args) for name, args in COMMANDS.items()}
        began = time.perf_counter()
        populate(client, names, KEYS)
        fill_s = time.perf_counter() - began
        assert client.dbsize() >= KEYS
        big = {name: run_counted(client, redis_url, args) for name, args in COMMANDS.items()}
    finally:
        client.close()
    for name in COMMANDS:
        (few, few_s), (many, many_s) = small[name], big[name]
        print(f"{name}: {sum(many.values())} commands; {few_s:.2f} s on a near-empty store, "
              f"{many_s:.2f} s with {KEYS:,} result keys (filled in {fill_s:.1f} s)")
        assert not {"scan", "keys", "hscan", "sscan", "zscan"} & set(many), many
        assert many == few, f"{name}: commands depend on the keyspace size"
