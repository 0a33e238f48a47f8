"""Worker middleware against a real Redis: the hook order for a batch, and a middleware that
vetoes fetching (nothing is read from the stream while it does, then everything completes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.redis_client import redis_client
from batchfleet.workers import Worker, WorkerSettings
from batchfleet.workers.completion import Completed
from batchfleet.workers.context import WorkerContext
from batchfleet.workers.intake import Answer, Intake
from batchfleet.workers.middleware import Batch, Middleware
from batchfleet.workers.middleware.defaults import default_middleware
from batchfleet.workers.runner import BatchRun
from tests.support.transports import Fleet, make_fleet

pytestmark = pytest.mark.e2e

MODEL = "demo-mlp"


class Recorder(Middleware):
    """Notes every hook call, with the request IDs it saw; can veto all fetching."""

    def __init__(self, veto: bool = False) -> None:
        self.calls: list[tuple[str, frozenset[str]]] = []
        self.veto = veto
        self._token: dict[str, str] = {}  # request ID -> its delivery's token, as noted

    def _note(self, hook: str, ids: Sequence[str] = ()) -> None:
        self.calls.append((hook, frozenset(ids)))

    async def on_start(self, ctx: WorkerContext) -> None:
        assert isinstance(ctx, WorkerContext)  # never the Worker itself
        self._note("on_start")

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._note("on_ready")

    async def on_stop(self, ctx: WorkerContext) -> None:
        self._note("on_stop")

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return models if self.veto else frozenset()

    def after_fetch(self, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        self._note("after_fetch", [repr(d.token) for d in deliveries])
        return deliveries

    async def after_decode(self, intake: Intake) -> None:
        self._token.update((j.request.request_id, repr(j.delivery.token)) for j in intake.jobs)
        self._note("after_decode", [j.request.request_id for j in intake.jobs])

    async def before_compute(self, batch: Batch) -> bool:
        self._note("before_compute", [j.request.request_id for j in batch.jobs])
        return True

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        self._note("after_compute", [j.request.request_id for j in batch.jobs])

    async def before_write(self, answers: Sequence[Answer]) -> None:
        self._note("before_write", [a.result.request_id for a in answers])

    def after_complete(self, done: Completed) -> None:
        self._note("after_complete", [a.result.request_id for a in done.answers])

    def hooks_of(self, request_id: str) -> list[str]:
        keys = {request_id, self._token.get(request_id, "")}
        return [hook for hook, ids in self.calls if keys & ids]


@pytest.fixture
def redis_fleet(redis_url: str) -> Fleet:
    return make_fleet("redis", redis_url, None)


@asynccontextmanager
async def worker_with(fleet: Fleet, recorder: Recorder, **overrides: Any
                      ) -> AsyncIterator[Worker]:
    settings = WorkerSettings.from_url(fleet.broker, fleet.results, namespace=fleet.namespace,
                                       device="cpu", **overrides)
    worker = Worker(settings, middleware=[*default_middleware(settings, [MODEL]), recorder])
    task = asyncio.create_task(worker.async_run())
    await asyncio.wait_for(worker.ready.wait(), 60)
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 60)


async def test_hooks_run_in_order_once_per_batch(redis_fleet: Fleet) -> None:
    recorder = Recorder()
    x = np.random.default_rng(3).random((40, 10), dtype=np.float32)
    async with worker_with(redis_fleet, recorder, max_batch_size=8) as worker, \
            redis_fleet.client() as client:
        ids = await client.submit_many(MODEL, x)
        results = await client.wait_many(ids, timeout=30)
        assert {r.status for r in results} == {"succeeded"}
        # after_complete runs once the ack is done: wait for the last one to be noted
        for _ in range(200):
            if all("after_complete" in recorder.hooks_of(i) for i in ids):
                break
            await asyncio.sleep(0.05)
        batches = worker.stats.batches
    assert recorder.calls[:2] == [("on_start", frozenset()), ("on_ready", frozenset())]
    assert recorder.calls[-1] == ("on_stop", frozenset())
    for request_id in ids:  # no callback_url: before_write never sees them
        assert recorder.hooks_of(request_id) == [
            "after_fetch", "after_decode", "before_compute", "after_compute", "after_complete"]
    # per batch, never per request
    computed = [ids for hook, ids in recorder.calls if hook == "before_compute"]
    assert len(computed) == batches and batches < len(ids)
    assert sorted(len(c) for c in computed)[-1] <= 8
    assert sum(len(c) for c in computed) == len(ids)


async def test_a_middleware_can_veto_fetching(redis_fleet: Fleet) -> None:
    recorder = Recorder(veto=True)
    names = redis_fleet.names
    stream = names.stream(MODEL, "interactive")
    x = np.random.default_rng(4).random((12, 10), dtype=np.float32)
    redis = redis_client(redis_fleet.broker)
    try:
        async with worker_with(redis_fleet, recorder) as worker, \
                redis_fleet.client() as client:
            ids = await client.submit_many(MODEL, x)
            for _ in range(10):  # several fetch-loop turns: still nothing read
                await asyncio.sleep(0.1)
                group = next(g for g in await redis.xinfo_groups(stream)
                             if g["name"] in (names.consumer_group,
                                              names.consumer_group.encode()))
                assert group["pending"] == 0 and group["lag"] == len(ids)
            assert not [c for c in recorder.calls if c[0] == "after_fetch"]
            assert worker.metrics.lane_pause_counts() == {MODEL: 1}
            recorder.veto = False
            results = await client.wait_many(ids, timeout=30)
        assert [r.status for r in results] == ["succeeded"] * len(ids)
        assert (await redis.xpending(stream, names.consumer_group))["pending"] == 0
    finally:
        await redis.aclose()
