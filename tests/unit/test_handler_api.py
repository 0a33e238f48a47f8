"""The public handler API (docs/models.md): ``from batchfleet import ModelHandler,
TensorSpec, InvalidInputError``, one ``TensorSpec`` everywhere, the hooks' defaults, and a
``preprocess`` that runs on a thread of its own before the device is taken."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import Request
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.compute import ComputeThread
from batchfleet.workers.jobs import Job

pytestmark = pytest.mark.unit


def test_the_handler_api_is_public_and_there_is_one_tensor_spec() -> None:
    from batchfleet import InvalidInputError, ModelHandler, TensorSpec
    from batchfleet.schemas import errors, registry
    from batchfleet.workers import models

    assert InvalidInputError is errors.InvalidInputError
    assert TensorSpec is registry.TensorSpec is models.TensorSpec
    assert ModelHandler is models.ModelHandler
    spec = TensorSpec.parse("float32[3, 224, 224]")
    assert spec == TensorSpec("float32", (3, 224, 224))
    assert spec.to_wire() == {"dtype": "float32", "shape": [3, 224, 224]}  # the registry's
    assert TensorSpec.from_wire(spec.to_wire()) == spec
    assert spec.zeros(2).shape == (2, 3, 224, 224)
    with pytest.raises(ValidationError, match="dtype 'complex64' is not one of"):
        TensorSpec("complex64", (2,))
    with pytest.raises(ValidationError, match="non-negative"):
        TensorSpec("float32", (-1,))


class Doubler:
    """A handler written against the protocol's defaults: only ``predict``."""

    def __init__(self) -> None:
        self.threads: dict[str, str] = {}

    name = "doubler"
    version = "1"
    input_spec = None

    def setup(self, device: torch.device) -> None:
        self.threads["setup"] = threading.current_thread().name

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        self.threads["preprocess"] = threading.current_thread().name
        if any(float(np.asarray(x).sum()) < 0 for x in inputs):
            raise ValueError("negative row")
        return torch.from_numpy(np.stack(inputs))  # type: ignore[arg-type]

    def predict(self, batch: Any) -> Any:
        self.threads["predict"] = threading.current_thread().name
        return batch * 2

    def postprocess(self, outputs: Any, count: int) -> list[Tensors]:
        return list(outputs.numpy())


def test_subclassing_the_protocol_inherits_the_defaults() -> None:
    from batchfleet import ModelHandler

    class OnlyPredict(ModelHandler):
        def predict(self, batch: Any) -> Any:
            return batch + 1

    handler = OnlyPredict()
    assert isinstance(handler, ModelHandler) and handler.input_spec is None
    handler.setup(torch.device("cpu"))
    rows = [np.arange(3, dtype=np.float32), np.ones(3, np.float32)]
    out = handler.postprocess(handler.predict(handler.preprocess(rows)), 2)
    assert [o.tolist() for o in out] == [[1, 2, 3], [2, 2, 2]]  # type: ignore[union-attr]
    named = handler.preprocess([{"a": np.ones(2, np.int64)}, {"a": np.zeros(2, np.int64)}])
    assert named["a"].shape == (2, 2)


def _jobs(*rows: np.ndarray) -> list[Job]:
    return [Job(Delivery("doubler", "interactive", b"", token=None),
                Request(f"r{i}", "doubler", row)) for i, row in enumerate(rows)]


async def test_preprocess_runs_off_the_loop_and_off_the_device_thread() -> None:
    handler = Doubler()
    compute = ComputeThread({"doubler": handler}, torch.device("cpu"))
    try:
        await compute.setup()
        run = await compute.run("doubler", _jobs(np.ones(2, np.float32),
                                                  np.full(2, 3, np.float32)))
        assert [o.tolist() for o in run.outputs] == [[2, 2], [6, 6]]  # type: ignore[union-attr]
        assert handler.threads["predict"].startswith("compute_")
        assert handler.threads["preprocess"].startswith("compute-prepare")
        assert threading.current_thread().name not in handler.threads.values()
        assert run.forwards == 1
        # a preprocess failure is pinned on its request by bisection, the others succeed
        run = await compute.run("doubler", _jobs(np.ones(2, np.float32),
                                                  np.full(2, -1, np.float32),
                                                  np.full(2, 2, np.float32)))
        errors = [type(o).__name__ for o in run.outputs if isinstance(o, Exception)]
        assert errors == ["ModelError"] and "negative row" in str(run.outputs[1])
        assert run.outputs[0].tolist() == [2, 2]  # type: ignore[union-attr]
    finally:
        compute.shutdown()


async def test_the_built_in_module_handler_collates_in_the_compute_thread() -> None:
    """Its preprocess is the copy to the device: no extra thread hop for demo models."""
    from batchfleet.workers.models import load_model
    from batchfleet.workers.models.handler import preprocess_on_device

    assert preprocess_on_device(load_model("demo-mlp"))
    assert not preprocess_on_device(Doubler())  # type: ignore[arg-type]


def test_a_torchscript_error_keeps_the_line_with_the_real_error() -> None:
    from batchfleet.workers.runner import as_model_error

    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(10, 4)))
    with pytest.raises(RuntimeError) as caught:
        scripted(torch.zeros(2, 5))
    message = str(as_model_error(caught.value))
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x5 and 10x4)" in message
    assert "The following operation failed" not in message and "\n" not in message
    assert str(as_model_error(ValueError("plain"))) == "ValueError: plain"


def test_input_spec_setting_fills_a_missing_spec_and_refuses_a_contradiction() -> None:
    from batchfleet import TensorSpec
    from batchfleet.cli_worker import resolve
    from batchfleet.schemas.errors import ConfigError
    from batchfleet.workers.models import load_model

    settings, _ = resolve({"broker": "redis://h:1/0", "models": ["lin=torch.nn:Identity"],
                           "input_spec": ["lin=float32[3,224,224]"]})
    assert settings.input_spec_for("other") is None
    with pytest.raises(ConfigError, match="must look like DTYPE"):
        resolve({"broker": "redis://h:1/0", "input_spec": ["float32(10)"]})
    spec = settings.input_spec_for("lin")
    assert spec == TensorSpec("float32", (3, 224, 224))
    handler = load_model("lin=torch.nn:Identity", input_spec=spec)
    assert handler.input_spec == spec
    with pytest.raises(ConfigError, match=r"takes float32\[10\]; --input-spec int64\[3\]"):
        load_model("demo-mlp", input_spec=TensorSpec("int64", (3,)))



class Gated(Doubler):
    """A preprocess that hangs on a row of 99 until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        if any(float(np.asarray(x)[0]) == 99 for x in inputs):
            self.release.wait(30)
        return super().preprocess(inputs)


async def test_a_preprocess_timeout_gives_up_only_its_own_batch() -> None:
    """The preprocess pool is shared by the lanes: one batch's timeout must not cancel
    another's preprocess queued behind it, and new batches go to a fresh thread."""
    import asyncio

    handler = Gated()
    compute = ComputeThread({"doubler": handler}, torch.device("cpu"))  # type: ignore[dict-item]
    row: list[Tensors] = [np.ones(2, np.float32)]
    try:
        hang: list[Tensors] = [np.full(2, 99, np.float32)]
        hung = asyncio.create_task(compute._prepared("doubler", hang, 0.3))
        await asyncio.sleep(0.05)  # the hung one holds the thread
        queued = asyncio.create_task(compute._prepared("doubler", row, 30.0))
        assert await hung is None  # given up: the compute thread will preprocess it
        fresh = await asyncio.wait_for(compute._prepared("doubler", row, 30.0), 10.0)
        assert fresh is not None and fresh.batch.tolist() == [[1, 1]]  # a fresh thread
        assert not queued.done()  # still waiting behind the hung thread: not cancelled
        handler.release.set()
        got = await asyncio.wait_for(queued, 10.0)  # runs once the hung thread returns
        assert got is not None and got.batch.tolist() == [[1, 1]]
    finally:
        handler.release.set()
        compute.shutdown()
