"""The OutputStats middleware on its own, over a ``memory://`` plane: what counts, the
kind guess, windows by time, and a refused flush kept for the next one."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors.memory_plane import open_memory_control_plane
from batchfleet.connectors.output_stats import Flush
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.workers.jobs import Job
from batchfleet.workers.middleware.base import Batch, BatchKey
from batchfleet.workers.middleware.output_stats import OutputStats, counted
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun

pytestmark = pytest.mark.unit


class RefusesOnce:
    """The memory store, refusing its first flush as a store outage would."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.refused = inner, 0

    async def flush(self, model: str, flush: Flush) -> None:
        if not self.refused:
            self.refused += 1
            raise ResultStoreError("store down")
        await self.inner.flush(model, flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _batch(n: int, version: str = "v1") -> Batch:
    jobs = [Job(None, Request(uuid.uuid4().hex, "m", np.full(3, float(i), np.float32)))  # type: ignore[arg-type]
            for i in range(n)]
    return Batch(BatchKey(0, "m", None, version=version), jobs)


def test_only_successful_requests_count() -> None:
    batch = _batch(3)
    run = BatchRun([np.array([0.1, 0.9]), ResultStoreError("x"), np.array([0.7, 0.3])],
                   0.0, 0.001, 1)
    outs, ins = counted(batch, run)
    assert len(outs) == len(ins) == 2
    assert float(ins[1][0]) == 2.0  # the third request's inputs, not the failed one's


async def test_windows_kinds_and_a_refused_flush_kept_for_the_next() -> None:
    plane = open_memory_control_plane(f"memory://outmw-{uuid.uuid4().hex[:8]}")
    store = RefusesOnce(plane.output_stats)
    mw = OutputStats(PerModel(None), window_s=60, keep_s=3600)
    mw._ctx = SimpleNamespace(plane=SimpleNamespace(output_stats=store))  # type: ignore[assignment]
    scores = [np.array([0.2, 0.8]), np.array([0.9, 0.1])]
    mw.record("m", "v1", scores, [np.zeros(3), np.ones(3)], now=1_000_000.0)
    mw.record("m", "v1", scores, [np.zeros(3), np.ones(3)], now=1_000_070.0)  # next window
    assert mw.kind("m", "v1", scores[0]) == "scores"
    await mw.flush()  # the first window's write is refused: kept, the second's lands
    assert store.refused == 1
    assert (await plane.output_stats.read("m", 0))[("v1", "outputs")].rows == 2
    await mw.flush()
    got = await plane.output_stats.read("m", 999_000.0)
    outputs = got[("v1", "outputs")]
    assert outputs.rows == 4 and outputs.series["output"].classes == {0: 2, 1: 2}
    assert got[("v1", "inputs")].series["output"].count == 12
    only_second = await plane.output_stats.read("m", 1_000_061.0)
    assert only_second[("v1", "outputs")].rows == 2
    await plane.close()


async def test_guard_evidence_merges_settled_windows_once_and_rereads_recent_ones() -> None:
    import time

    from batchfleet.connectors.output_summary import summarise_batch

    plane = open_memory_control_plane(f"memory://outev-{uuid.uuid4().hex[:8]}")
    store = plane.output_stats
    mw = OutputStats(PerModel(None), window_s=60, keep_s=7200)
    mw._ctx = SimpleNamespace(plane=plane)  # type: ignore[assignment]
    now = int(time.time()) // 60 * 60
    rows = [np.array([0.5], np.float32)] * 1500

    async def add(start: int, label: str) -> None:
        await store.flush("m", Flush(start, 60, 7200, {
            (label, "outputs"): summarise_batch(rows, "regression")}))

    for label in ("stable", "canary"):
        await add(now - 600, label)  # settled
        await add(now, label)  # recent
    found = await mw.output_evidence("m", "canary", "stable", now - 900)
    assert found is not None
    canary, stable = found
    assert (canary.count, stable.count) == (3000, 3000)
    assert canary.psi is not None and canary.psi < 0.02
    await add(now, "canary")  # the recent window grows: read again
    await add(now - 600, "canary")  # a settled window written late: not read again
    canary, _ = await mw.output_evidence("m", "canary", "stable", now - 900) or (None, None)
    assert canary is not None and canary.count == 4500
    assert await mw.output_evidence("m", "nobody", "stable", now - 900) is None
    await plane.close()


async def test_outputs_a_summary_cannot_read_are_dropped_never_raised() -> None:
    mw = OutputStats(PerModel(None), window_s=60, keep_s=3600)
    ragged = [np.zeros(2), np.zeros(3)] * 2048  # shapes change between requests
    mw.record("m", "v1", ragged, [np.zeros(1)] * len(ragged), now=0.0)  # folds: no raise
    mw.record("m", "v1", [np.zeros(2)], [np.zeros(1)], now=0.0)
    (_, flush), = await mw.take()
    assert flush.deltas[("v1", "outputs")].rows == 1  # only what could be read


async def test_folds_run_on_the_statistics_thread_never_on_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An image model's fold takes milliseconds per request: record() only holds and
    hands off, and the summaries are computed on another thread than the caller's."""
    import threading

    from batchfleet.workers.middleware import output_stats

    threads: list[int] = []
    real = output_stats.summarise_batch

    def spy(tensors: list[Any], kind: str | None) -> Any:
        threads.append(threading.get_ident())
        return real(tensors, kind)

    monkeypatch.setattr(output_stats, "summarise_batch", spy)
    mw = OutputStats(PerModel(None), window_s=60, keep_s=3600)
    image = np.ones((3, 224, 224), np.float32)  # 602 KB a request: folds by bytes
    rows = output_stats.FOLD_BYTES // image.nbytes + 1
    mw.record("m", "v1", [np.zeros(4, np.float32)] * rows, [image] * rows, now=0.0)
    held = mw._held[(0, "m", "v1")]
    assert not held.outputs and len(held.pending) == 1  # handed off, not summarised here
    mw.record("m", "v1", [np.zeros(4, np.float32)], [image], now=0.0)
    (_, flush), = await mw.take()
    assert flush.deltas[("v1", "inputs")].rows == rows + 1
    assert threads and threading.get_ident() not in threads
    await mw.on_stop(None)  # type: ignore[arg-type]


async def test_a_statistics_thread_that_falls_behind_leaves_batches_out_never_holds_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory stays bounded: past ``max_pending`` queued folds a batch is left out of the
    statistics (logged), not held; a flush's remainder is still counted."""
    import threading

    from batchfleet.workers.middleware import output_stats

    gate = threading.Event()
    real = output_stats.summarise_batch

    def slow(tensors: list[Any], kind: str | None) -> Any:
        gate.wait(10)
        return real(tensors, kind)

    monkeypatch.setattr(output_stats, "summarise_batch", slow)
    mw = OutputStats(PerModel(None), window_s=60, keep_s=3600, max_pending=1)
    fold = [np.zeros(1, np.float32)] * output_stats.FOLD_ROWS
    mw.record("m", "v1", fold, fold, now=0.0)  # queued on the (blocked) thread
    mw.record("m", "v1", fold, fold, now=0.0)  # one fold behind already: left out
    held = mw._held[(0, "m", "v1")]
    assert len(held.pending) == 1 and not held.outputs and mw._skipped == len(fold)
    mw.record("m", "v1", fold[:5], fold[:5], now=0.0)
    gate.set()
    (_, flush), = await mw.take()
    assert flush.deltas[("v1", "outputs")].rows == len(fold) + 5
    assert mw._skipped == 0  # reported at the flush
    await mw.on_stop(None)  # type: ignore[arg-type]


class SlowFlush:
    """The memory store, whose writes take a while (a busy Redis)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def flush(self, model: str, flush: Flush) -> None:
        import asyncio

        await asyncio.sleep(0.05)
        await self.inner.flush(model, flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_flush_returns_only_once_a_flush_in_progress_has_written() -> None:
    """The background flush had taken what was held and was still writing when the
    test's own flush found nothing held and returned: the read after it missed 1,000 to
    3,000 of 6,000 requests in the full suite (the two-worker output statistics test)."""
    import asyncio

    plane = open_memory_control_plane(f"memory://outfl-{uuid.uuid4().hex[:8]}")
    mw = OutputStats(PerModel(None), window_s=60, keep_s=3600)
    mw._ctx = SimpleNamespace(plane=SimpleNamespace(output_stats=SlowFlush(plane.output_stats)))  # type: ignore[assignment]
    scores = [np.array([0.2, 0.8])] * 5
    mw.record("m", "v1", scores, [np.zeros(3)] * 5, now=1_000_000.0)
    background = asyncio.create_task(mw.flush())
    await asyncio.sleep(0.01)  # it has taken the held rows and is writing them
    await mw.flush()
    assert (await plane.output_stats.read("m", 0))[("v1", "outputs")].rows == 5
    await background
    await plane.close()
