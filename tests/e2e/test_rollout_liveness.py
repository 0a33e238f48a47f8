"""``rollout status`` counts a worker as live only while its heartbeat is fresh (issue 23
#11): a SIGKILLed worker drops out after two missed beats, while its heartbeat record
(10 s TTL) and its registry entry (trusted 30 s) are both still there."""

from __future__ import annotations

import asyncio

import pytest

from batchfleet.connectors.heartbeats import HeartbeatProbe
from batchfleet.connectors.rollout import open_rollouts
from batchfleet.processes import WorkerProcess
from batchfleet.schemas.names import Names

pytestmark = pytest.mark.e2e
NS = "rl"


async def test_a_sigkilled_worker_is_not_live_before_its_heartbeat_expires(
        redis_url: str) -> None:
    victim = WorkerProcess(redis_url, namespace=NS).start()
    rollouts = open_rollouts(redis_url, Names(NS))
    probe = HeartbeatProbe(redis_url, Names(NS))
    try:
        await asyncio.to_thread(victim.wait_ready)
        for _ in range(100):  # registered and beating
            if (await rollouts.status("demo-mlp")).workers():
                break
            await asyncio.sleep(0.1)
        assert list((await rollouts.status("demo-mlp")).workers()) == [victim.worker_id]
        victim.kill()
        for _ in range(150):
            found = await rollouts.status("demo-mlp")
            if victim.worker_id not in found.workers():
                break
            await asyncio.sleep(0.1)
        assert victim.worker_id not in found.workers()
        # dropped before its heartbeat expired, and while its registry entry still counts
        assert await asyncio.to_thread(probe.present, victim.worker_id)
        assert found.record.served[victim.worker_id].live(found.at)
        assert victim.worker_id not in found.to_json()["workers"]
    finally:
        victim.kill()
        probe.close()
        await rollouts.close()
