"""Killed workers, a crashing request and a Redis crash: every request still ends exactly once."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.dlq import DeadLetterOps
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.errors import BatchfleetError, WaitTimeoutError
from tests.support.models import CRASH, POISON
from tests.support.transports import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL = "poison=tests.support.models:poison_model"
#: The same model at 10 ms a batch, for runs whose disruptions are tied to the backlog.
PACED_MODEL = "poison=tests.support.models:paced_poison_model"


@pytest.fixture
def durable_redis() -> Iterator[EmbeddedRedis]:
    """Redis with AOF fsync on every write, so a SIGKILL of the server loses nothing."""
    with EmbeddedRedis(appendonly=True) as server:
        yield server


def _worker(url: str, *extra: str, model: str = MODEL) -> WorkerProcess:
    return WorkerProcess(url, models=(model,), extra_args=(
        "--claim-idle-ms", "500", "--retry-base-s", "0.05", "--retry-cap-s", "0.2",
        "--max-batch-size", "32", *extra))


async def _wait_all(client: AsyncClient, ids: list[str], timeout: float,
                    keep_alive: list[WorkerProcess] | None = None, *extra: str,
                    model: str = MODEL) -> list[Result]:
    """Wait for every result; restart any worker that died meanwhile (a supervisor's job)."""
    waiting = asyncio.create_task(client.wait_many(ids, timeout=timeout))
    restarts = 0
    while not waiting.done():
        for i, proc in enumerate(keep_alive or []):
            if not proc.alive:
                restarts += 1
                keep_alive[i] = _worker(proc.broker, *extra,  # type: ignore[index]
                                        model=model).start()
        await asyncio.sleep(0.2)
    return waiting.result()


async def _diagnose(url: str, namespace: str, ids: list[str], results: list[Result | None]
                    ) -> str:
    """Where the requests without a result are stuck: their records, streams and retries."""
    from batchfleet.connectors.redis_client import redis_client
    from batchfleet.schemas.envelopes import decode_request_header
    from batchfleet.schemas.names import Names

    names, redis = Names(namespace), redis_client(url)
    try:
        missing = [rid for rid, r in zip(ids, results, strict=True)
                   if r is None or not r.is_terminal][:5]
        lines = [f"{len(missing)}+ without a result"]
        for rid in missing:
            record = await redis.hgetall(names.result(rid))
            lines.append(f"{rid}: {({k: v for k, v in record.items() if k != b'body'})}")
        retries = [decode_request_header(m).request_id
                   for m in await redis.zrange(names.retry_schedule, 0, -1)]
        lines.append(f"in retry schedule: {[r for r in retries if r in missing]}")
        for key in [k async for k in redis.scan_iter(match=f"{namespace}:stream:*")]:
            lines.append(f"{key!r}: len={await redis.xlen(key)} "
                         f"pending={await redis.xpending(key, names.consumer_group)}")
        return "\n".join(lines)
    finally:
        await redis.aclose()


async def _dlq_ids(url: str, namespace: str = "bf") -> list[str]:
    ops = DeadLetterOps(url, None, namespace)
    try:
        return [dl.request_id for dl in await ops.letters()]
    finally:
        await ops.close()


async def test_a_request_that_kills_its_worker_is_quarantined(redis_url: str) -> None:
    rows = np.full((40, 10), 0.5, np.float32)
    rows[17, 0] = CRASH
    workers = [_worker(redis_url, "--quarantine-after", "2").start()]
    try:
        await asyncio.to_thread(workers[0].wait_ready)
        async with AsyncClient(redis_url) as client:
            ids = await client.submit_many("poison", rows)
            results = await _wait_all(client, ids, 90, workers, "--quarantine-after", "2")
    finally:
        for w in workers:
            w.kill()
    crashed = results[17]
    assert crashed.status == "failed" and crashed.error is not None
    assert crashed.error.type == "crash_loop", crashed.error
    assert all(r.status == "succeeded" for i, r in enumerate(results) if i != 17), [
        (i, r.status, r.error) for i, r in enumerate(results) if r.status != "succeeded"]
    assert await _dlq_ids(redis_url) == [ids[17]]


async def test_a_killer_takes_as_many_workers_on_kafka_as_on_redis(fleet: Fleet) -> None:
    """Kafka keeps no delivery count; its log claims tell a redelivery from a first delivery
    (``workers.log_positions``), so a request that kills its worker is a suspect at its
    first redelivery on both transports: with ``--quarantine-after 2`` it takes three
    workers (its batch's, then two runs alone) and no more, and its neighbours complete."""
    rows = np.full((40, 10), 0.5, np.float32)
    rows[17, 0] = CRASH
    extra = ("--quarantine-after", "2", "--claim-idle-ms", "500", "--max-batch-size", "32")
    workers = [fleet.process(*extra, models=(MODEL,)).start()]
    deaths = 0
    try:
        await asyncio.to_thread(workers[0].wait_ready)
        async with fleet.client() as client:
            ids = await client.submit_many("poison", rows)
            waiting = asyncio.create_task(client.wait_many(ids, timeout=150))
            while not waiting.done():
                if not workers[-1].alive:  # a supervisor's restart
                    deaths += 1
                    workers.append(fleet.process(*extra, models=(MODEL,)).start())
                await asyncio.sleep(0.2)
            results = waiting.result()
    finally:
        for w in workers:
            w.kill()
    crashed = results[17]
    assert crashed.error is not None and crashed.error.type == "crash_loop", crashed.error
    assert "each of the 2 times it ran alone" in crashed.error.message
    assert all(r.status == "succeeded" for i, r in enumerate(results) if i != 17), [
        (i, r.status, r.error) for i, r in enumerate(results) if r.status != "succeeded"]
    assert deaths == 3


async def test_redis_crash_with_aof_mid_run_loses_nothing(durable_redis: EmbeddedRedis) -> None:
    url = durable_redis.url
    rows = np.random.default_rng(6).random((5000, 10), dtype=np.float32)
    with _worker(url) as worker:
        await asyncio.to_thread(worker.wait_ready)
        async with AsyncClient(url) as client:
            ids = await client.submit_many("poison", rows)
            await asyncio.sleep(0.3)
            durable_redis.kill()  # SIGKILL: only what AOF already has survives
            await asyncio.sleep(1.0)
            durable_redis.start()
            results = await client.wait_many(ids, timeout=120)
        assert worker.alive, worker.log_tail()
    assert all(r.status == "succeeded" for r in results)
    assert "retrying after failure" in worker.log_path.read_text() or \
        "fetch failed" in worker.log_path.read_text()


async def _backlog(redis: Redis, key: str) -> int | None:
    """Requests not yet acknowledged (acked entries are deleted); None while Redis is down."""
    try:
        return int(await redis.xlen(key))
    except RedisError:
        return None


async def test_chaos_run_on_redis_every_request_ends_exactly_once(
        durable_redis: EmbeddedRedis) -> None:
    """Disruptions are tied to progress, not to the clock, so they land mid-run on any machine."""
    from batchfleet.connectors.redis_client import redis_client
    from batchfleet.schemas.names import LANE_INTERACTIVE, Names

    url = durable_redis.url
    n, rng = 5000, random.Random(7)
    rows = np.random.default_rng(7).random((n, 10), dtype=np.float32)
    poison = sorted(rng.sample(range(n), n // 50))
    rows[poison, 0] = POISON
    extra = ("--quarantine-after", "10", "--max-attempts", "3")
    # paced: on a fast host the plain model drained the backlog between two looks
    workers = [_worker(url, *extra, model=PACED_MODEL).start() for _ in range(2)]
    stream = Names("bf").stream("poison", LANE_INTERACTIVE)
    kill_at = [0.9, 0.7, 0.5, 0.3]  # fractions of the backlog still queued
    kills_mid_run, redis_crashes = 0, 0
    probe = redis_client(url)
    try:
        for w in workers:
            await asyncio.to_thread(w.wait_ready)
        async with AsyncClient(url) as client:
            ids = await client.submit_many("poison", rows)
            waiting = asyncio.create_task(_wait_all(client, ids, 180, workers, *extra,
                                                    model=PACED_MODEL))
            started = time.monotonic()
            while kill_at and not waiting.done():
                backlog = await _backlog(probe, stream)
                alive = [w for w in workers if w.alive]
                if backlog is None or backlog > kill_at[0] * n or not alive or backlog == 0:
                    await asyncio.sleep(0.02)
                    continue
                kill_at.pop(0)
                rng.choice(alive).kill()  # _wait_all restarts it, as a supervisor would
                kills_mid_run += 1
                if kills_mid_run == 2:  # the broker-side disruption: Redis itself crashes
                    durable_redis.kill()
                    await asyncio.sleep(0.5)
                    durable_redis.start()
                    redis_crashes += 1
            try:
                results = await waiting
            except WaitTimeoutError:
                raise AssertionError(await _diagnose(
                    url, "bf", ids, await client._waiter.fetch(ids))) from None
            took = time.monotonic() - started
    finally:
        await probe.aclose()
        for w in workers:
            w.kill()
    statuses = [r.status for r in results]
    failed = [i for i, s in enumerate(statuses) if s == "failed"]
    assert kills_mid_run >= 2 and redis_crashes == 1, (kills_mid_run, redis_crashes)
    assert statuses.count("succeeded") + len(failed) == n  # every request ended...
    assert failed == poison  # ...and only the poison failed
    assert sorted(set(await _dlq_ids(url))) == sorted(ids[i] for i in poison)
    print(f"chaos (redis): {n} requests, {statuses.count('succeeded')} succeeded, "
          f"{len(failed)} failed (all poison, all in the DLQ), {kills_mid_run} worker kills "
          f"mid-run, {redis_crashes} Redis crash, {took:.1f}s")


@pytest.mark.kafka
async def test_chaos_run_on_kafka_every_request_ends_exactly_once(
        durable_redis: EmbeddedRedis, kafka_server: object, kafka_broker: str) -> None:
    from batchfleet.connectors.embedded_kafka import EmbeddedKafka
    from tests.support.transports import KAFKA_SESSION_MS, make_fleet

    fleet = make_fleet("kafka", durable_redis.url, kafka_broker)
    n, rng = 5000, random.Random(11)
    rows = np.random.default_rng(11).random((n, 10), dtype=np.float32)
    poison = sorted(rng.sample(range(n), n // 50))
    rows[poison, 0] = POISON
    extra = ("--quarantine-after", "10", "--max-attempts", "3", "--retry-base-s", "0.05",
             "--retry-cap-s", "0.2", "--kafka-session-timeout-ms", str(KAFKA_SESSION_MS))

    def start() -> WorkerProcess:
        return WorkerProcess(fleet.broker, fleet.results, models=(MODEL,),
                             namespace=fleet.namespace, extra_args=extra).start()

    workers = [start(), start()]
    kills = 0
    try:
        for w in workers:
            await asyncio.to_thread(w.wait_ready)
        async with fleet.client() as client:
            ids = await client.submit_many("poison", rows)
            waiting = asyncio.create_task(client.wait_many(ids, timeout=240))
            for step in range(3):
                await asyncio.sleep(2.0)
                victim = rng.randrange(len(workers))
                workers[victim].kill()
                kills += 1
                workers[victim] = start()
                if step == 0 and isinstance(kafka_server, EmbeddedKafka):
                    kafka_server.freeze()  # the broker-side disruption: a 3 s broker stall
                    await asyncio.sleep(3.0)
                    kafka_server.thaw()
            results = await waiting
    finally:
        for w in workers:
            w.kill()
    statuses = [r.status for r in results]
    failed = [i for i, s in enumerate(statuses) if s == "failed"]
    assert statuses.count("succeeded") + len(failed) == n
    assert failed == poison
    assert sorted(set(await _dlq_ids(durable_redis.url, fleet.namespace))) == sorted(
        ids[i] for i in poison)
    print(f"chaos (kafka): {n} requests, {statuses.count('succeeded')} succeeded, "
          f"{len(failed)} failed (all poison, all in the DLQ), {kills} worker kills, "
          f"1 broker stall")



async def _settle(waiting: asyncio.Task[list[Result]], workers: list[WorkerProcess],
                  *extra: str) -> tuple[list[Result], list[str]]:
    """(results, lost IDs) of a wait_many with timeout=None, restarting dead workers meanwhile;
    the outer bound is a liveness check: nothing may hang."""
    from batchfleet.schemas.errors import RequestLostError

    async def supervise() -> None:
        while not waiting.done():
            for i, proc in enumerate(workers):
                if not proc.alive:
                    workers[i] = _worker(proc.broker, *extra).start()
            await asyncio.sleep(0.2)

    await asyncio.wait_for(supervise(), 80)
    try:
        return waiting.result(), []
    except RequestLostError as exc:
        return [r for r in exc.results if r is not None], exc.request_ids


async def _submit_when_back(client: AsyncClient, rows: np.ndarray) -> list[str]:
    """Submit as soon as Redis and the model registry (a heartbeat away) are back."""
    for _ in range(100):
        try:
            return await client.submit_many("poison", rows)
        except BatchfleetError:
            await asyncio.sleep(0.2)
    raise AssertionError("could not submit after the restart")


async def _log_says(path: Path, text: str, within_s: float) -> bool:
    """Whether ``text`` appears in the log at ``path`` within ``within_s`` (a liveness bound)."""
    deadline = time.monotonic() + within_s
    while text not in await asyncio.to_thread(path.read_text):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def _restart_empty_with_doomed(
        server: EmbeddedRedis, survivor: WorkerProcess, client: AsyncClient, rows: np.ndarray
) -> tuple[list[str], asyncio.Task[list[Result]]]:
    """Restart Redis empty with the survivor frozen, after submitting ``rows`` that no worker
    can have read: they are surely lost, however slowly this process got here on a busy
    machine (a CI run once got here after the workers had finished all 3,000)."""
    assert survivor.proc is not None
    pid = survivor.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        doomed = await client.submit_many("poison", rows)
        waiting = asyncio.create_task(client.wait_many(doomed, timeout=None))
        server.stop()  # no AOF, no RDB: it comes back empty
        server.start()
    finally:
        os.kill(pid, signal.SIGCONT)
    return doomed, waiting


async def test_chaos_run_with_redis_restarted_empty_reconciles(redis_server: EmbeddedRedis
                                                               ) -> None:
    """Redis restarted WITHOUT persistence mid-run, plus a worker kill: every request ends
    succeeded, failed (poison) or reported lost; nothing hangs; nothing submitted after the
    restart is lost; the worker that lived through it serves on without a restart.
    Requests submitted while the survivor is frozen, just before the restart, are all
    reported lost."""
    from batchfleet.connectors.redis_client import redis_client
    from batchfleet.schemas.names import LANE_INTERACTIVE, Names

    url = redis_server.url
    n, rng = 3000, random.Random(13)
    rows = np.random.default_rng(13).random((n, 10), dtype=np.float32)
    poison = set(rng.sample(range(n), n // 50))
    rows[sorted(poison), 0] = POISON
    extra = ("--quarantine-after", "10", "--max-attempts", "3")
    workers = [_worker(url, *extra).start() for _ in range(2)]
    stream = Names("bf").stream("poison", LANE_INTERACTIVE)
    probe = redis_client(url)
    try:
        for w in workers:
            await asyncio.to_thread(w.wait_ready)
        survivor = workers[1]
        async with AsyncClient(url) as client:
            ids = await client.submit_many("poison", rows)
            # Waiting from the start: results that land before the restart are kept.
            waiting = asyncio.create_task(client.wait_many(ids, timeout=None))
            killed = False
            while True:  # disruptions tied to progress, not to the clock
                backlog = await _backlog(probe, stream)
                if backlog is not None and not killed and backlog < 0.9 * n:
                    workers[0].kill()  # restarted by the supervisor below
                    killed = True
                if backlog is not None and killed and backlog < 0.6 * n:
                    break
                await asyncio.sleep(0.02)
            doomed, doomed_waiting = await _restart_empty_with_doomed(
                redis_server, survivor, client, rows[:200])
            after = await _submit_when_back(
                client, np.random.default_rng(14).random((300, 10), dtype=np.float32))
            done_after, lost_after = await _settle(
                asyncio.create_task(client.wait_many(after, timeout=None)), workers, *extra)
            done, lost = await _settle(waiting, workers, *extra)
            done_doomed, lost_doomed = await _settle(doomed_waiting, workers, *extra)
            assert survivor.alive, survivor.log_tail()
            # It put back what Redis lost (its heartbeat; the registry and the group too,
            # unless the restarted worker got there first) and served on, never restarted.
            # Its next beat notices; the requests may all settle before that beat.
            healed = await _log_says(survivor.log_path, "heartbeat was gone", within_s=30)
    finally:
        await probe.aclose()
        for w in workers:
            w.kill()
    succeeded = sum(r.status == "succeeded" for r in done)
    failed = {ids.index(r.request_id) for r in done if r.status == "failed"}
    assert succeeded + len(failed) + len(lost) == n
    assert failed <= poison  # only poison ever fails
    assert not lost_after and all(r.status == "succeeded" for r in done_after)
    assert not done_doomed and sorted(lost_doomed) == sorted(doomed)
    assert succeeded and healed
    print(f"chaos (redis restarted empty): {n} requests, {succeeded} succeeded, "
          f"{len(failed)} failed (poison), {len(lost)} reported lost; {len(after)} submitted "
          f"after the restart all succeeded")
