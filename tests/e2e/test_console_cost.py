"""What the console costs Redis (issue 30): the commands one refresh issues, counted from
``INFO commandstats`` as ``bench --capacity`` counts them, are the same with 20k more
result keys (no keyspace scan); ten pages asking at once cost one read; ten pages
polling for a while cost at most one read per cache period. Numbers are printed (run
with ``-s``; docs/performance.md, "Console"), never asserted as speeds."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis

from batchfleet.producers import AsyncClient
from batchfleet.producers.console.settings import ConsoleSettings
from batchfleet.schemas.names import Names
from tests.e2e.test_console import ROWS, two_model_worker
from tests.e2e.test_ops_at_scale import command_counts, populate
from tests.support.console import live_console

pytestmark = pytest.mark.e2e

EXTRA_KEYS = 20_000
#: Seconds ten pages poll in the last step.
POLL_S = 6.0


def _delta(client: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = command_counts(client)
    delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    delta.pop("info", None)
    return delta


async def _one_refresh(http: httpx.AsyncClient, url: str, client: redis.Redis,
                       settle_s: float) -> dict[str, int]:
    await asyncio.sleep(settle_s)  # past the shared read's cache period
    before = command_counts(client)
    assert (await http.get(url)).status_code == 200
    return _delta(client, before)


async def test_a_refresh_costs_the_same_at_any_keyspace_size_and_pages_share_it(
        redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    # the worker's own traffic (heartbeats, fetches) must not count: measure with it gone,
    # after it ran, so the lanes, registry, DLQ and heartbeat-less fleet stay as it left them
    async with two_model_worker(redis_url) as _, AsyncClient(redis_url) as sdk:
        bad = ROWS[:2].copy()
        bad[:, 0] = -999.0
        ids = await sdk.submit_many("demo-mlp", ROWS) + await sdk.submit_many("poison", bad)
        await sdk.wait_many(ids, timeout=60)
    settings = ConsoleSettings(broker=redis_url, refresh_s=2.0)  # reads shared for 1 s
    try:
        with live_console(settings) as base:
            url = base + "api/overview"
            async with httpx.AsyncClient(timeout=30) as http:
                await _one_refresh(http, url, client, 0.0)  # opens the connections
                small = await _one_refresh(http, url, client, 1.1)
                populate(client, Names(), EXTRA_KEYS)
                big = await _one_refresh(http, url, client, 1.1)
                await asyncio.sleep(1.1)
                before = command_counts(client)
                answers = await asyncio.gather(*(http.get(url) for _ in range(10)))
                ten_at_once = _delta(client, before)
                assert {a.status_code for a in answers} == {200}

                async def page() -> None:  # a page polls every refresh_s
                    end = time.monotonic() + POLL_S
                    while time.monotonic() < end:
                        await http.get(url)
                        await asyncio.sleep(settings.refresh_s)

                await asyncio.sleep(1.1)
                before = command_counts(client)
                began = time.monotonic()
                await asyncio.gather(*(page() for _ in range(10)))
                polled_s = time.monotonic() - began
                ten_pages = _delta(client, before)
    finally:
        client.close()
    per_refresh = sum(small.values())
    print(f"\none refresh: {per_refresh} commands {dict(sorted(small.items()))}")
    print(f"ten pages polling every {settings.refresh_s:g} s for {polled_s:.1f} s: "
          f"{sum(ten_pages.values())} commands, {sum(ten_pages.values()) / polled_s:.1f}/s "
          f"(one page alone: {per_refresh / settings.refresh_s:.1f}/s)")
    assert small == big, "a refresh's commands changed with the keyspace's size"
    assert not {"scan", "keys"} & set(small)
    assert ten_at_once == small  # ten pages asking at once share one read
    reads = sum(ten_pages.values()) / per_refresh
    assert reads <= polled_s / 1.0 + 2  # at most one read per cache period (1 s)
