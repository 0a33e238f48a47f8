"""A worker whose every lane is paused still polls its broker (``Worker._poll_paused``):
a Kafka member that stops polling for ``max_poll_interval_ms`` (5 min) leaves its group,
and an operator's pause or a store outage can last that long. On ``memory://``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.workers.middleware import Middleware
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.models.handler import TorchModuleHandler
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

pytestmark = pytest.mark.unit


class PauseAll(Middleware):
    """Pauses every model while ``on`` is set (as an open store breaker does)."""

    def __init__(self) -> None:
        self.on = True

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return models if self.on else frozenset()

    def pause_s(self) -> float | None:
        return 0.01 if self.on else None


async def test_a_worker_with_every_lane_paused_keeps_polling_and_takes_nothing() -> None:
    url = f"memory://paused-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False)
    handlers = {"m": TorchModuleHandler("m", torch.nn.Identity())}
    pause = PauseAll()
    worker = Worker(settings, handlers,
                    middleware=[pause, *default_middleware(settings, handlers)])
    client = AsyncClient(url, check_model=False)
    running = asyncio.create_task(worker.async_run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 30)
        polls: list[tuple[int, float]] = []
        fetch = worker.consumer.fetch

        async def counted(max_count: int, timeout_s: float) -> Any:
            polls.append((max_count, timeout_s))
            return await fetch(max_count, timeout_s)

        worker.consumer.fetch = counted  # type: ignore[method-assign]
        await asyncio.sleep(0.3)
        assert len(polls) >= 5  # every pause_s (10 ms), not never
        assert all(timeout == 0.0 for _, timeout in polls)  # no blocking read while paused
        # a request queued meanwhile waits in its lane, then is served once resumed
        rid = await client.submit("m", np.array([1.0, 2.0], dtype=np.float32))
        await asyncio.sleep(0.2)
        assert len(worker.batcher) == 0 and (await client.get(rid)).status == "pending"
        pause.on = False
        result = await client.wait(rid, 10)
        assert result.status == "succeeded"
    finally:
        await client.close()
        worker.request_stop()
        await running
        reset_memory(url)
