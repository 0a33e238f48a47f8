"""Models are built on the compute thread, where they later run (``compute_pool``).

OpenMP gives each thread that runs a parallel torch op a pool of threads of its own; a
model built on the main thread leaves that pool idle beside the compute thread's, and
once a process holds more OpenMP threads than cores, libgomp makes every barrier of
every forward sleep instead of spin (docs/performance.md, "One OpenMP pool"). The worker
therefore builds its ``--model`` models on the compute thread. These tests pin the
thread, not the speed.
"""

from __future__ import annotations

import importlib
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from batchfleet.connectors.memory_state import reset_memory
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker
from tests.support.threads import threads_gone

pytestmark = pytest.mark.unit

FACTORY = '''
import threading

import torch

from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.workers.models.handler import TorchModuleHandler

BUILT_ON: list[str] = []
RAN_ON: list[str] = []


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RAN_ON.append(threading.current_thread().name)
        return x * 2


def build() -> TorchModuleHandler:
    BUILT_ON.append(threading.current_thread().name)
    return TorchModuleHandler("doubler", Doubler(), input_spec=TensorSpec("float32", (4,)))
'''


def _app(tmp_path: Path, source: str) -> str:
    """A module of ``source`` under ``tmp_path`` (the worker's --app-dir); its name."""
    module = f"buildprobe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    return module


async def test_the_worker_builds_its_models_on_the_thread_that_runs_them(tmp_path: Path) -> None:
    module = _app(tmp_path, FACTORY)
    url = f"memory://build-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False, app_dir=str(tmp_path),
                                       models=(f"doubler={module}:build",))
    worker = Worker(settings)
    try:
        probe = importlib.import_module(module)
        assert len(probe.BUILT_ON) == 1
        built_on = probe.BUILT_ON[0]
        assert built_on != threading.current_thread().name
        assert built_on.startswith("compute_")  # the compute pool's one thread, not -loader
        await worker.compute.setup()  # the warm-up forwards run where the model was built
        assert probe.RAN_ON and set(probe.RAN_ON) == {built_on}
    finally:
        worker.compute.shutdown()
        reset_memory(url)


def test_a_model_that_fails_to_build_fails_the_worker_with_its_own_error(
        tmp_path: Path) -> None:
    module = _app(tmp_path, "def build():\n    raise ValueError('no weights here')\n")
    url = f"memory://build-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False, app_dir=str(tmp_path),
                                       models=(f"broken={module}:build",))
    before = set(threading.enumerate())
    with pytest.raises(ConfigError, match="no weights here"):
        Worker(settings)
    assert threads_gone("compute", before, within_s=10)  # the thread it was built on exits
    reset_memory(url)
