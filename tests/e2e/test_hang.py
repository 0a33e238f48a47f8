"""Issue 23, finding 1: one hanging request stays in its box, with default settings.

Two worker processes serve ``hang`` (sleeps an hour on a marker row) and demo-mlp with
``--claim-idle-ms 3000`` and no ``--compute-timeout-s``: the learned limit (10 s floor)
contains the hang on the worker that fetched it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import httpx
import numpy as np
import pytest

from batchfleet.connectors.embedded_server import free_port
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.workers.compute_limits import FLOOR_S
from batchfleet.workers.middleware.stuck import EXIT_STUCK
from tests.support.models import HANG

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODELS = ("hang=tests.support.models:hang_model", "demo-mlp")


def _rows(n: int, hang_at: int | None = None) -> np.ndarray:
    rows = np.full((n, 10), 0.25, np.float32)
    if hang_at is not None:
        rows[hang_at, 0] = HANG
    return rows


async def _readyz(http: httpx.AsyncClient, port: int) -> tuple[int, dict[str, Any]]:
    response = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return response.status_code, response.json()


async def _check(redis_url: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", "check", "--broker", redis_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=os.environ.copy())
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def test_a_hanging_request_is_quarantined_and_the_fleet_keeps_serving(
        redis_url: str) -> None:
    ports = [free_port(), free_port()]
    workers = [WorkerProcess(redis_url, models=MODELS, extra_args=(
        "--claim-idle-ms", "3000", "--metrics-port", str(port))).start() for port in ports]
    stuck_seen: dict[int, int] = {0: 0, 1: 0}  # worker index -> /readyz polls saying stuck
    try:
        for w in workers:
            w.wait_ready()
        async with AsyncClient(redis_url) as client, httpx.AsyncClient() as http:
            # each worker learns hang's limit from its own batches: 10x p99, floored at 10 s
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "the limits were never learned"
                ok = await client.wait_many(await client.submit_many("hang", _rows(2)), 20)
                assert {r.status for r in ok} == {"succeeded"}
                limits = [(await _readyz(http, p))[1]["compute_limits_s"] for p in ports]
                if all(lim["hang"] == FLOOR_S for lim in limits):
                    break

            async def watch() -> None:
                while True:
                    for i, port in enumerate(ports):
                        code, body = await _readyz(http, port)
                        if body["stuck_compute"]:
                            assert code == 503 and not body["checks"]["compute_not_stuck"]
                            stuck_seen[i] += 1
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch())
            sent = time.monotonic()
            ids = await client.submit_many("hang", _rows(301, hang_at=150))
            while not any(stuck_seen.values()):  # the hang is past its limit: stuck
                assert time.monotonic() - sent < 60, "no worker ever reported the stall"
                await asyncio.sleep(0.2)
            # check reads heartbeats, which carry the stall within a beat or two of /readyz
            beat_by = time.monotonic() + 8
            code, out = await _check(redis_url)
            while code != 1 and time.monotonic() < beat_by:
                await asyncio.sleep(0.5)
                code, out = await _check(redis_url)
            assert code == 1 and "hang: compute stuck for" in out, out
            fresh = await client.submit_many("demo-mlp", _rows(200))
            served = await client.wait_many(fresh, timeout=15)  # within seconds, not a hang
            assert {r.status for r in served} == {"succeeded"}
            results = await client.wait_many(ids, timeout=max(1.0, 120 - (time.monotonic()
                                                                        - sent)))
            assert time.monotonic() - sent < 120
            watcher.cancel()
        hung = results.pop(150)
        assert hung.status == "failed" and hung.error is not None
        assert hung.error.type == "stalled" and not hung.error.retryable
        assert {r.status for r in results} == {"succeeded"} and len(results) == 300
        # the other worker never hung on it: only one ever stalled, reported or logged
        stalled_on = [i for i, w in enumerate(workers) if "compute stalled" in
                      w.log_path.read_text()]
        assert len(stalled_on) == 1 and stuck_seen[1 - stalled_on[0]] == 0
        assert stuck_seen[stalled_on[0]] > 0
        assert "request quarantined: it stalls compute" in \
            workers[stalled_on[0]].log_path.read_text()
    finally:
        for w in workers:
            w.terminate()


async def test_a_thread_stuck_past_stuck_exit_s_ends_the_worker_with_75(redis_url: str) -> None:
    """The stuck thread cannot be killed: the worker drains and exits for a restart."""
    worker = WorkerProcess(redis_url, models=MODELS, extra_args=(
        "--compute-timeout-s", "hang=1", "--stuck-exit-s", "2")).start()
    try:
        worker.wait_ready()
        async with AsyncClient(redis_url) as client:
            (hung,) = await client.wait_many(
                await client.submit_many("hang", _rows(1, hang_at=0)), timeout=30)
            assert hung.status == "failed" and hung.error is not None
            assert hung.error.type == "stalled"
        assert worker.proc is not None
        code = await asyncio.to_thread(worker.proc.wait, 60)
        assert code == EXIT_STUCK
        assert "compute thread stuck for good" in worker.log_path.read_text()
    finally:
        worker.terminate()
