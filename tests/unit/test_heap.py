"""The worker process freezes its start-up heap out of the cyclic GC (``workers.heap``), a
worker run inside someone else's process does not, and a model dropped at run time is
still collected when it sits in a reference cycle among the frozen objects.

Freezing is process-wide, so what freezes runs in a child process, never in pytest's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

from batchfleet.workers.models.handler import TorchModuleHandler
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

pytestmark = pytest.mark.unit


def _child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_cycle_among_frozen_objects_is_collected_only_by_collect_everything() -> None:
    out = _child("""
        import gc, weakref
        from batchfleet.workers.heap import YOUNG_THRESHOLD, collect_everything, freeze_long_lived

        class Model:  # a model that refers to itself, as a bound hook does
            def __init__(self): self.me = self
        model = Model()
        alive = weakref.ref(model)
        frozen = freeze_long_lived()
        del model
        gc.collect()
        print(frozen > 1000, alive() is not None)   # frozen: a plain collect misses it
        collect_everything()
        print(alive() is None, gc.get_freeze_count() > 1000)  # freed; the rest refrozen
        print(gc.get_threshold()[0] == YOUNG_THRESHOLD)
    """)
    assert out.split() == ["True"] * 5


def test_collect_everything_in_an_unfrozen_process_freezes_nothing() -> None:
    assert _child("""
        import gc
        from batchfleet.workers.heap import collect_everything
        collect_everything()
        print(gc.get_freeze_count())
    """) == "0"


async def test_a_worker_run_inside_another_process_leaves_its_heap_alone() -> None:
    url = f"memory://heap-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False)
    worker = Worker(settings, {"m": TorchModuleHandler("m", torch.nn.Identity())})
    before = gc.get_freeze_count(), gc.get_threshold()
    running = asyncio.create_task(worker.async_run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 30)
        assert (gc.get_freeze_count(), gc.get_threshold()) == before
        assert before[0] == 0
    finally:
        worker.request_stop()
        await asyncio.wait_for(running, 30)


@pytest.mark.timeout(120)
def test_the_worker_process_freezes_its_heap_once_ready() -> None:
    """``batchfleet worker`` logs how many objects it froze at "worker ready"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchfleet", "worker", "--broker",
         f"memory://heap-{uuid.uuid4().hex[:8]}", "--model", "demo-mlp", "--no-webhooks",
         "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    ready: dict[str, object] = {}
    deadline = time.monotonic() + 90
    try:
        for line in proc.stdout:
            if '"worker ready"' in line:
                ready = json.loads(line)
                break
            assert time.monotonic() < deadline, "no 'worker ready' within 90 s"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert isinstance(ready.get("frozen_objects"), int)
    assert ready["frozen_objects"] > 10_000  # torch, the model and the libraries
    assert proc.returncode == 0
