"""A version held only while loaded (``workers.models.lazy``): built and warmed up off the
compute thread, attached and detached by it, measured from its parameters and buffers."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest
import torch

from batchfleet.schemas.errors import ModelNotLoadedError
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.models.lazy import ResidentHandler, module_memory_mb
from batchfleet.workers.models.loading import load_model, load_versions
from tests.support.threads import threads_gone

pytestmark = pytest.mark.unit


def test_memory_is_parameters_and_buffers() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256))
    expected = sum(t.numel() * t.element_size()
                   for t in (*module.parameters(), *module.buffers())) / 2**20
    handler = load_model("m=demo-mlp")
    assert module_memory_mb(module) == pytest.approx(expected)
    assert module_memory_mb(handler) == pytest.approx(
        sum(p.numel() * 4 for p in handler.module.parameters()) / 2**20)  # type: ignore[attr-defined]
    assert module_memory_mb(object()) == 0.0


def test_a_resident_handler_knows_its_version_unloaded_and_serves_only_when_attached() -> None:
    made: list[int] = []

    def make() -> object:
        made.append(1)
        return load_model("m=demo-mlp")

    handler = ResidentHandler("m", make)  # type: ignore[arg-type]
    assert not handler.resident and handler.version.startswith("sha256:") and made == [1]
    assert handler.input_spec is not None
    rows = [handler.input_spec.zeros()]
    with pytest.raises(ModelNotLoadedError):
        handler.predict(handler.input_spec.zeros())
    built = handler.build(torch.device("cpu"), (1, 4))
    assert made == [1, 1] and built.warmup_s >= 0 and built.memory_mb > 0
    assert not handler.resident  # built, not yet attached
    handler.attach(built.handler)
    out = handler.postprocess(handler.predict(handler.preprocess(rows)), 1)
    assert len(out) == 1
    handler.detach()
    assert not handler.resident


async def test_the_compute_thread_loads_swaps_and_unloads_between_batches() -> None:
    versions = load_versions(["m=demo-mlp"], on_demand=True)
    compute = ComputeThread({"m@default": versions["m"]["default"]}, torch.device("cpu"))
    handler = versions["m"]["default"]
    assert isinstance(handler, ResidentHandler)
    before = set(threading.enumerate())
    try:
        assert await compute.setup() == {}  # nothing loaded at start
        [built] = await compute.load(["m@default"], (1, 8))
        assert handler.resident and built.load_s >= 0
        first = handler.version
        await compute.swap("m@default", partial(load_model, "m=demo-mlp:seed=5"), "2",
                           "repo/m/2", (1,))
        assert handler.resident and handler.version != first
        assert handler.version.startswith("2/sha256:") and handler.source == "repo/m/2"
        await compute.unload(["m@default"])
        assert not handler.resident
        # a new version of a model that is not loaded: only its version is learnt; the
        # next load builds it
        await compute.swap("m@default", partial(load_model, "m=demo-mlp:seed=6"), "3",
                           "repo/m/3", (1,))
        assert not handler.resident and handler.version.startswith("3/sha256:")
        third = handler.version
        await compute.load(["m@default"], (1,))
        assert handler.resident and handler.version == third
        # each load's thread exits after it, and its OpenMP pool with it (compute_pool)
        assert threads_gone("compute-loader", before, within_s=10)
    finally:
        compute.shutdown()
        await asyncio.sleep(0)


def test_warm_up_runs_on_the_repository_sample_when_there_is_one(tmp_path: object) -> None:
    """A ``warmup_sample`` (one request's inputs, ``numpy.save``d) is what the warm-up
    batches are made of; without one, zeros of the input spec."""
    from pathlib import Path

    import numpy as np

    from batchfleet.schemas.tensor_spec import TensorSpec
    from batchfleet.workers.models.handler import TorchModuleHandler

    seen: list[float] = []

    class Record(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(float(x.sum()))
            return x.sum(dim=1, keepdim=True)

    def make() -> TorchModuleHandler:
        return TorchModuleHandler("r", Record(), input_spec=TensorSpec("float32", (3,)))

    sample = Path(str(tmp_path)) / "sample.npy"
    np.save(sample, np.full(3, 2.0, np.float32))
    handler = ResidentHandler("r", make, sample=str(sample))  # type: ignore[arg-type]
    handler.build(torch.device("cpu"), (1, 4))
    assert seen == [6.0, 24.0]
    seen.clear()
    ResidentHandler("r", make).build(torch.device("cpu"), (2,))  # type: ignore[arg-type]
    assert seen == [0.0]
