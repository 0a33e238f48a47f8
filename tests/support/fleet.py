"""Running real workers in tests: in-process (for counters) or as child processes (for crashes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from batchfleet.workers import Worker, WorkerSettings
from batchfleet.workers.models import ModelHandler


@asynccontextmanager
async def running_worker(
    broker: str,
    results: str | None = None,
    handlers: Mapping[str, ModelHandler] | None = None,
    **overrides: Any,
) -> AsyncIterator[Worker]:
    """A real Worker on the current loop; stopped gracefully (SIGTERM path) on exit."""
    overrides.setdefault("device", "cpu")
    worker = Worker(WorkerSettings.from_url(broker, results, **overrides), handlers)
    task = asyncio.create_task(worker.async_run())
    ready = asyncio.create_task(worker.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=60,
                                 return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        task.result()  # raises the start-up error
    if ready not in done:
        raise TimeoutError("worker did not become ready in 60s")
    try:
        yield worker
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 90)
