"""A Kafka broker that loses its log: waits end, none hangs, and new submits work.

The test owns its broker (Tansu, in-memory storage), so restarting it empty does
not disturb the session's shared one: the log, the topics and the consumer group's
offsets are all gone at once, under load, and then one of the two worker
processes is SIGKILLed, as in issue 23's report.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import numpy as np
import pytest

from batchfleet.connectors.embedded_kafka import EmbeddedKafka, find_tansu
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient, RequestLostError, Result
from batchfleet.schemas.errors import ConfigError, TransportError
from tests.support.transports import KAFKA_SESSION_MS

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]
T = TypeVar("T")
SLOW = "slow=tests.support.models:SlowMLP"  # 20 ms a batch: a backlog builds
LANE_LOST = "Kafka lane lost its log"


@pytest.fixture
def own_kafka() -> EmbeddedKafka:
    try:
        find_tansu()
    except ConfigError as exc:
        pytest.skip(f"needs Tansu to restart a broker empty: {exc}")
    return EmbeddedKafka()


async def _retrying(call: Callable[[], Awaitable[T]], within_s: float = 20.0) -> T:
    """A submit racing the broker's restart may be refused; the same client retries."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except TransportError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _outcome(client: AsyncClient, ids: Sequence[str]) -> tuple[list[Result], list[str]]:
    """(terminal results, lost IDs); ``timeout=None`` under a liveness bound: none may hang."""
    try:
        return await asyncio.wait_for(client.wait_many(ids, timeout=None), 60), []
    except RequestLostError as exc:
        assert len(exc.results) == len(ids)
        return [r for r in exc.results if r is not None], exc.request_ids


def _lane_loss_warnings(worker: WorkerProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in worker.log_path.read_text().splitlines()
            if LANE_LOST in line and line.startswith("{")]


@pytest.mark.xfail(strict=False, reason=(
    "known defect, open: under load (the full suite; 2 of 2 CI rehearsals on 2026-11-26, "
    "about 1 run in 3 beside a CI run) Tansu, restarted empty while publishes race it, "
    "hands out records past the log end it reports (offsets 0-15 with a highwater of 11 "
    "and a ListOffsets end of 7, fetch after fetch), and some requests then never reach a "
    "worker or a loss marker; the consumer's livelock on it is fixed "
    "(test_an_end_that_stands_below_fetched_records_is_not_a_loss_each_time)"))
async def test_tansu_restarted_empty_under_load_waits_end_and_new_submits_work(
        redis_url: str, own_kafka: EmbeddedKafka) -> None:
    """Every wait ends (succeeded or RequestLostError), a worker logs the loss, submits
    during the restart are accepted, and a new client's requests afterwards all succeed,
    with no process restarted (but the SIGKILLed worker)."""
    rows = np.random.default_rng(23).random((3000, 10), dtype=np.float32)
    with own_kafka as kafka:
        extra = ("--max-batch-size", "8", "--kafka-session-timeout-ms", str(KAFKA_SESSION_MS))
        survivor, victim = (WorkerProcess(kafka.url, redis_url, models=(SLOW,), namespace="kl",
                                          extra_args=extra).start() for _ in range(2))
        try:
            await asyncio.to_thread(survivor.wait_ready)
            await asyncio.to_thread(victim.wait_ready)
            async with AsyncClient(kafka.url, redis_url, namespace="kl") as client:
                before = await client.submit_many("slow", rows)
                await asyncio.sleep(1.0)
                kafka.kill()  # a crash; in-memory storage: it comes back with nothing
                kafka.start()
                after = await _retrying(lambda: client.submit_many("slow", rows[:200]))
                victim.kill()
                done_before, lost_before = await _outcome(client, before)
                done_after, lost_after = await _outcome(client, after)
            # a new client (a fresh producer) once the fleet has noticed the loss
            async with AsyncClient(kafka.url, redis_url, namespace="kl") as fresh_client:
                fresh = await fresh_client.submit_many("slow", rows[:300])
                done_fresh, lost_fresh = await _outcome(fresh_client, fresh)
            assert survivor.alive, survivor.log_tail()
        finally:
            victim.kill()
            survivor.terminate()
    assert len(done_before) + len(lost_before) == len(before)
    assert lost_before, "the restart found nothing queued: make the backlog longer"
    assert all(r.status == "succeeded" for r in done_before)
    assert len(done_after) + len(lost_after) == len(after)
    assert all(r.status == "succeeded" for r in done_after)
    assert not lost_fresh and len(done_fresh) == len(fresh)
    assert all(r.status == "succeeded" for r in done_fresh)
    warned = _lane_loss_warnings(survivor) + _lane_loss_warnings(victim)
    assert warned, "no worker logged the lane loss"
    print(f"kafka restart: {len(before)} queued before, {len(lost_before)} reported lost, "
          f"{len(done_before)} finished; {len(after)} submitted during the restart: "
          f"{len(done_after)} finished, {len(lost_after)} lost; {len(fresh)} submitted "
          f"afterwards by a new client, all succeeded; {len(warned)} lane-loss warning(s)")
