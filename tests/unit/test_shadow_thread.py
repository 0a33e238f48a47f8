"""The shadow's own thread, its time budget and the delayed-stable-batch ledger, on real
threads (the worker end to end: tests/e2e/test_rollout_shadow.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.rollout_stats import PolicyCache, VersionStats
from batchfleet.workers.middleware.shadow import Shadow
from batchfleet.workers.middleware.shadow_thread import (
    ShadowBudget,
    ShadowThread,
    Span,
    delayed_by,
)
from batchfleet.workers.per_model import PerModel

pytestmark = pytest.mark.unit


def test_budget_rests_a_model_for_its_share_of_wall_time() -> None:
    budget = ShadowBudget(PerModel(0.25, ((("slow", None), 0.5), (("off", None), 0.0),
                                          (("free", None), None), (("m", "v9"), 1.0))))
    assert budget.allows("m", "v2", 10.0)
    budget.spent("m", "v2", 1.0, now=10.0)  # 1 s at a quarter: 3 s of rest
    assert not budget.allows("m", "v2", 12.99)
    assert budget.allows("m", "v2", 13.0)
    budget.spent("slow", "v2", 1.0, now=10.0)  # at a half: 1 s of rest
    assert (budget.allows("slow", "v2", 10.99), budget.allows("slow", "v2", 11.0)) == (
        False, True)
    assert not budget.allows("off", "v2", 1e9)  # 0: the shadow never runs here
    budget.spent("free", "v2", 60.0, now=10.0)  # none: no rest at all
    assert budget.allows("free", "v2", 10.0)
    assert (budget.share("m", "v9"), budget.share("m", "v2")) == (1.0, 0.25)  # MODEL@SHADOW


@pytest.mark.parametrize("share", [1.5, -0.1])
def test_a_budget_outside_zero_to_one_fails_loudly_at_construction(share: float) -> None:
    with pytest.raises(ConfigError, match="--shadow-budget"):
        Shadow(WorkerMetrics(), PolicyCache(), VersionStats(WorkerMetrics(), PolicyCache()),
               budget=PerModel(0.25, ((("demo-mlp", None), share),)))


def test_delayed_means_queued_behind_the_shadow_forward_on_its_thread() -> None:
    assert not delayed_by(None, 5.0, 7)  # no shadow was running at hand-off
    assert not delayed_by(Span(1.0, thread=7), 5.0, 7)  # still running when the batch started
    assert not delayed_by(Span(1.0, end=6.0, thread=7), 5.0, 7)  # started before it ended
    # started after it ended, but on another thread: scheduling, not a queue behind it
    assert not delayed_by(Span(1.0, end=5.0, thread=8), 5.0, 7)
    assert delayed_by(Span(1.0, end=5.0, thread=7), 5.0, 7)


async def test_a_shadow_on_its_own_thread_delays_no_batch_but_one_on_compute_would() -> None:
    """The ledger's two sides on real threads: a stable batch handed over while a waiting
    shadow runs starts at once beside it on its own thread, and is counted delayed when
    both share one compute thread (the arrangement before issue 23)."""
    loop = asyncio.get_running_loop()
    compute = ThreadPoolExecutor(max_workers=1)
    shadow = ShadowThread()
    try:
        running = shadow.run(lambda: (time.sleep(0.3), threading.current_thread().name)[1])
        assert shadow.busy and shadow.current is not None
        span = shadow.current
        # a stable batch, meanwhile
        started, thread = await loop.run_in_executor(compute, _when_and_where)
        assert not delayed_by(span, started, thread)
        assert await running == "shadow"
        assert span.end is not None and not shadow.busy

        shared = Span(time.time())  # the old way: the shadow queued on the compute thread

        def old_shadow() -> None:
            shared.thread = threading.get_ident()
            time.sleep(0.1)
            shared.end = time.time()

        first = loop.run_in_executor(compute, old_shadow)
        started, thread = await loop.run_in_executor(compute, _when_and_where)
        await first
        assert delayed_by(shared, started, thread)
    finally:
        shadow.shutdown()
        compute.shutdown()


def _when_and_where() -> tuple[float, int]:
    """What a stable batch's run records: when its forward started, and on which thread."""
    return time.time(), threading.get_ident()


async def test_a_shadow_error_reaches_the_awaiting_coroutine_and_frees_the_thread() -> None:
    shadow = ShadowThread()
    try:
        def fails() -> None:
            raise RuntimeError("shadow backend down")

        with pytest.raises(RuntimeError, match="backend down"):
            await shadow.run(fails)
        assert not shadow.busy
        assert await shadow.run(lambda: 7) == 7  # the same thread serves the next one
    finally:
        shadow.shutdown()
    assert all(t.daemon for t in threading.enumerate() if t.name == "shadow")
