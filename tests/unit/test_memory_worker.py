"""The worker's runtime on ``memory://``, end to end in one process and in milliseconds:
the failure policy (retry, then the DLQ, neighbours unharmed), batching (size cap,
expired deadlines never computed), routing (a pinned version), and a middleware
(a request cancelled while queued is dropped unrun). The end-to-end suite still runs
these paths on real Redis, Tansu and worker processes; these pin the logic fast."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet import AsyncClient
from batchfleet.connectors import open_control_plane
from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.tensors import signature
from batchfleet.workers.intake import Job
from batchfleet.workers.models.handler import ModelHandler, TorchModuleHandler
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

pytestmark = pytest.mark.unit

POISON = -1.0


class Flaky(torch.nn.Module):
    """Fails every batch holding a poisoned row (first element -1) until the poisoned row
    has failed ``fails`` times on its own (bisection isolates it first)."""

    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails = fails
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(int(x.shape[0]))
        if self.fails > 0 and bool((x[:, 0] == POISON).any()):
            self.fails -= int(x.shape[0] == 1)
            raise RuntimeError("poisoned row")
        return x * 2


class Fleet:
    """A worker and a client on one fresh ``memory://`` store."""

    def __init__(self, worker: Worker, client: AsyncClient, url: str) -> None:
        self.worker, self.client, self.url = worker, client, url
        self.running: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.running = asyncio.create_task(self.worker.async_run())
        await asyncio.wait_for(self.worker.ready.wait(), 30)


@asynccontextmanager
async def fleet(handlers: Mapping[str, ModelHandler] | None = None, *,
                versions: Mapping[str, Mapping[str, ModelHandler]] | None = None,
                start: bool = True, **settings: Any) -> AsyncIterator[Fleet]:
    url = f"memory://worker-{uuid.uuid4().hex[:8]}"
    s = WorkerSettings.from_url(url, webhooks=False, **settings)
    found = Fleet(Worker(s, handlers, versions=versions), AsyncClient(url, check_model=False),
                  url)
    try:
        if start:
            await found.start()
        yield found
    finally:
        await found.client.close()
        found.worker.request_stop()
        if found.running is not None:
            await found.running
        reset_memory(url)


def row(first: float) -> np.ndarray[Any, Any]:
    return np.array([first, 1.0, 2.0, 3.0], dtype=np.float32)


async def test_a_model_error_is_retried_and_its_neighbours_succeed() -> None:
    model = Flaky(fails=1)
    async with fleet({"m": TorchModuleHandler("m", model)}, retry_base_s=0.01,
                     retry_cap_s=0.01) as f:
        ids = [await f.client.submit("m", row(x)) for x in (POISON, 5.0, 6.0)]
        results = [await f.client.wait(i, 10) for i in ids]
    assert [r.status for r in results] == ["succeeded"] * 3
    assert [r.attempts for r in results] == [2, 1, 1]


async def test_an_exhausted_request_is_dead_lettered_with_its_history() -> None:
    async with fleet({"m": TorchModuleHandler("m", Flaky(fails=99))}, max_attempts=2,
                     retry_base_s=0.01, retry_cap_s=0.01) as f:
        bad = await f.client.submit("m", row(POISON))
        good = await f.client.submit("m", row(1.0))
        failed, ok = await f.client.wait(bad, 10), await f.client.wait(good, 10)
        plane = open_control_plane(f.url, namespace="bf")
        letters = await plane.dead_letters.list("m")
    assert (failed.status, ok.status) == ("failed", "succeeded")
    assert [(dl.request_id, dl.attempts, len(dl.errors)) for dl in letters] == [(bad, 2, 2)]


async def test_batches_respect_the_size_cap_and_expired_requests_are_not_computed() -> None:
    model = Flaky(fails=0)
    async with fleet({"m": TorchModuleHandler("m", model)}, start=False, max_batch_size=4,
                     max_wait_ms=50) as f:
        late = await f.client.submit("m", row(1.0), deadline_s=0.001)
        await asyncio.sleep(0.05)
        ids = [await f.client.submit("m", row(float(i))) for i in range(10)]
        await f.start()
        expired = await f.client.wait(late, 10)
        results = [await f.client.wait(i, 10) for i in ids]
    assert expired.status == "expired"
    assert {r.status for r in results} == {"succeeded"}
    assert max(model.batches) <= 4 and sum(model.batches) == 10
    assert max(r.batch_size or 0 for r in results) <= 4


async def test_a_pinned_version_is_served_by_that_version() -> None:
    v1 = TorchModuleHandler("m", Flaky(fails=0), version="sha256:one")
    v2 = TorchModuleHandler("m", Flaky(fails=0), version="sha256:two")
    async with fleet(versions={"m": {"v1": v1, "v2": v2}}) as f:
        pinned = await f.client.wait(await f.client.submit("m", row(1.0), version="v2"), 10)
        default = await f.client.wait(await f.client.submit("m", row(1.0)), 10)
    assert pinned.status == default.status == "succeeded"
    assert pinned.model_version.startswith("v2/sha256:two")
    assert default.model_version.startswith("v1/sha256:one")


async def test_a_request_cancelled_while_queued_is_dropped_unrun() -> None:
    model = Flaky(fails=0)
    async with fleet({"m": TorchModuleHandler("m", model)}, start=False) as f:
        rid = await f.client.submit("m", row(1.0))
        plane: Any = open_control_plane(f.url, namespace="bf")
        [report] = await plane.cancels.cancel([rid])
        assert report.outcome == "cancelled"
        await f.start()
        await f.client.submit("m", row(2.0))  # a later request runs: the first was dropped
        for _ in range(100):
            if await plane.cancels.size() == 0 and model.batches:
                break
            await asyncio.sleep(0.02)
        result = await f.client.wait(rid, 1)
    assert result.status == "cancelled"
    assert sum(model.batches) == 1 and await plane.cancels.size() == 0


async def test_a_pipeline_runs_on_memory_as_on_redis() -> None:
    """memory:// parity for pipelines (docs/pipelines.md): a two-step chain of the same
    model, the result under the caller's ID with both steps."""
    from batchfleet.schemas.errors import RequestConflictError
    from batchfleet.schemas.pipeline import from_steps

    async with fleet({"m": TorchModuleHandler("m", Flaky(fails=0))}) as f:
        plane = open_control_plane(f.url, namespace="bf")
        await plane.pipelines.declare(from_steps("twice", "m,m"))
        rid = await f.client.submit("twice", row(1.5), request_id="mine")
        done = await f.client.wait(rid, 10)
        # a caller's own ID is idempotent with the same inputs, a conflict with others
        assert await f.client.submit("twice", row(1.5), request_id="mine") == "mine"
        with pytest.raises(RequestConflictError):
            await f.client.submit("twice", row(2.5), request_id="mine")
    assert done.status == "succeeded" and done.request_id == rid and done.model == "twice"
    assert np.asarray(done.outputs).tolist() == (row(1.5) * 4).tolist()
    assert [s["step"] for s in done.steps or []] == ["m", "m-2"]


async def test_batch_keys_part_requests_by_dtype_byte_order_and_shape_only() -> None:
    """``Worker._keyed`` looks a single tensor up by its dtype object and shape: requests
    alike share one key whatever fetch decoded them; another dtype, byte order or shape,
    or named tensors, get keys of their own, each holding the tensors' signature."""
    handler = TorchModuleHandler("m", torch.nn.Identity())
    async with fleet({"m": handler}, start=False) as found:
        inputs: list[Any] = [np.zeros(4, np.float32), np.ones(4, np.float32),
                             np.zeros(4, np.float64), np.zeros(4, ">f4"),
                             np.zeros(5, np.float32), {"a": np.zeros(4, np.float32)}]
        jobs = [Job(Delivery("m", "interactive", b"", token=None),
                    Request(f"r{i}", "m", x)) for i, x in enumerate(inputs)]
        keyed = found.worker._keyed(jobs)
    keys = [key for key, _ in keyed]
    assert [job for _, job in keyed] == jobs
    assert keys[0] is keys[1]
    assert len({id(k) for k in keys}) == 5 and len(set(keys)) == 5
    assert [k.signature for k in keys] == [signature(x) for x in inputs]
    assert {k.version for k in keys} == {next(iter(found.worker.versions["m"]))}
