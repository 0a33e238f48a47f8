"""Models are built on the compute thread, where they later run (``compute_pool``).

OpenMP gives each thread that runs a parallel torch op a pool of threads of its own; a
model built on the main thread leaves that pool idle beside the compute thread's, and
once a process holds more OpenMP threads than cores, libgomp makes every barrier of
every forward sleep instead of spin (docs/performance.md, ninth session). The worker
therefore builds its ``--model`` models on the compute thread. These tests pin the
thread, not the speed.
"""

from __future__ import annotations

import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from batchfleet.connectors.memory_state import reset_memory
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.worker import Worker

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


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    module = f"threadprobe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(FACTORY))
    (tmp_path / "module_name").write_text(module)
    return tmp_path


async def test_the_worker_builds_its_models_on_the_thread_that_runs_them(app_dir: Path) -> None:
    import importlib

    module = (app_dir / "module_name").read_text()
    url = f"memory://build-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False, app_dir=str(app_dir),
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
    (tmp_path / "brokenprobe.py").write_text(
        "def build():\n    raise ValueError('no weights here')\n")
    url = f"memory://build-{uuid.uuid4().hex[:8]}"
    settings = WorkerSettings.from_url(url, webhooks=False, app_dir=str(tmp_path),
                                       models=("broken=brokenprobe:build",))
    with pytest.raises(ConfigError, match="no weights here"):
        Worker(settings)
    reset_memory(url)
