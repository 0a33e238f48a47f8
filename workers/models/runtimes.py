"""Choosing how a model executes: eager, ``torch.compile`` or ONNX Runtime, at a precision.

A runtime is a handler concern: :func:`apply_runtime` wraps a loaded handler so the
worker's batching, bisection, OOM split, deadlines and breakers (all above the
handler) behave the same whatever runs the forward. The wrapper's ``setup`` is the
start-up gate: it refuses a combination the device cannot run (one line), builds
the runtime, warms every batch bucket, then compares it with eager fp32 on the
calibration rows (:mod:`.accuracy`) before the worker says "ready". The runtime
and precision are appended to ``model_version`` because they change the numbers.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchfleet.schemas.errors import ConfigError, ValidationError
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.models import accuracy
from batchfleet.workers.models.buckets import bucket_for, bucket_sizes, pad_rows, unpad_rows
from batchfleet.workers.models.handler import ModelHandler, TorchModuleHandler
from batchfleet.workers.models.onnx_runtime import OnnxSession, build_session, require_onnx

RUNTIMES = ("eager", "compile", "onnx")
PRECISIONS = ("fp32", "bf16", "fp16", "int8")


@dataclass(frozen=True, slots=True)
class RuntimeChoice:
    """How one model runs, and how strictly its accuracy is checked."""

    runtime: str = "eager"
    precision: str = "fp32"
    #: ``.npy`` rows for the accuracy gate; None: seeded random rows.
    calibration: Path | None = None
    accept_accuracy_loss: bool = False
    #: Max-abs difference allowed, relative to the reference outputs' std; None: the
    #: precision's default (accuracy.DEFAULT_TOLERANCE).
    tolerance: float | None = None

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"--runtime {self.runtime!r}: expected one of {', '.join(RUNTIMES)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"--precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.tolerance is not None and self.tolerance < 0:
            raise ConfigError("--accuracy-tolerance must not be negative")

    @property
    def is_default(self) -> bool:
        return self.runtime == "eager" and self.precision == "fp32"

    @property
    def label(self) -> str:
        """``onnx-int8``: what is appended to the model version."""
        return f"{self.runtime}-{self.precision}"

    @property
    def tolerance_or_default(self) -> float:
        return accuracy.DEFAULT_TOLERANCE[self.precision] if self.tolerance is None \
            else self.tolerance


def bf16_supported_on_cpu() -> bool:
    """Whether this torch can autocast to bfloat16 on the CPU."""
    return bool(torch.amp.is_autocast_available("cpu"))


def check_combination(model: str, choice: RuntimeChoice, device: torch.device) -> None:
    """Refuse, in one line, what ``device`` cannot run; a no-op for what it can."""
    runtime, precision = choice.runtime, choice.precision
    where = f"model {model!r}: --runtime {runtime} --precision {precision}"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"{where} needs CUDA; on {device.type} use bf16 or int8")
    if precision == "bf16" and device.type == "cpu" and not bf16_supported_on_cpu():
        raise ConfigError(f"{where}: this torch cannot autocast to bf16 on the CPU")
    if precision == "int8" and runtime != "onnx":
        raise ConfigError(f"{where} is not offered: int8 runs through ONNX Runtime's "
                          "quantize_dynamic, use --runtime onnx")
    if runtime == "onnx" and precision in ("bf16", "fp16"):
        raise ConfigError(f"{where} is not offered: ONNX runs fp32 or int8; use "
                          f"--runtime eager or compile for {precision}")
    if runtime == "onnx":
        require_onnx(model)


def apply_runtime(handler: ModelHandler, choice: RuntimeChoice,
                  max_batch_size: int) -> ModelHandler:
    """``handler`` unchanged for eager fp32; otherwise wrapped to run ``choice``."""
    if choice.is_default:
        return handler
    if not isinstance(handler, TorchModuleHandler):
        raise ConfigError(f"model {handler.name!r}: --runtime/--precision need an nn.Module "
                          "(a built-in, a .pt file or a factory returning a module); "
                          "this factory returned its own handler")
    return RuntimeHandler(handler, choice, max_batch_size)


def runtime_info(handlers: Mapping[str, ModelHandler]) -> dict[str, dict[str, Any]]:
    """Per model not on eager fp32: runtime, precision, measured accuracy (status, metrics)."""
    return {name: h.info() for name, h in handlers.items() if isinstance(h, RuntimeHandler)}


Backend = Callable[[torch.Tensor], torch.Tensor]


class RuntimeHandler:
    """A :class:`TorchModuleHandler` whose forward runs on another runtime or precision.

    Collation, validation and splitting stay the wrapped handler's; only ``predict``
    changes. Compiled and ONNX forwards see bucketed batch sizes (padded rows are
    cut off before ``postprocess``), so the shapes warmed at start-up are the only
    shapes they ever run.
    """

    #: Collation is the wrapped handler's copy to the device (``TorchModuleHandler``).
    preprocess_on_device = True

    def __init__(self, base: TorchModuleHandler, choice: RuntimeChoice,
                 max_batch_size: int, *, onnx_file: Path | None = None) -> None:
        self.base = base
        self.choice = choice
        self.name = base.name
        self.version = f"{base.version}/{choice.label}"
        self.input_spec = base.input_spec
        self.input_range = getattr(base, "input_range", None)
        self.max_batch_size = max_batch_size
        self.device = torch.device("cpu")
        self.accuracy: accuracy.AccuracyReport | None = None
        self.startup_s: dict[str, float] = {}
        self.providers: list[str] = []
        self._onnx_file = onnx_file
        self._backend: Backend | None = None
        self._bucketed = choice.runtime in ("compile", "onnx")

    # --- hooks ---------------------------------------------------------------

    def setup(self, device: torch.device) -> None:
        check_combination(self.name, self.choice, device)
        if self.input_spec is None:
            raise ConfigError(f"model {self.name!r}: --runtime {self.choice.runtime} needs "
                              "the model's input spec (dtype and shape) to export and warm it")
        self.base.setup(device)
        self.device = device
        start = time.perf_counter()
        self._backend = self._build()
        self.startup_s["build"] = time.perf_counter() - start
        start = time.perf_counter()
        for size in bucket_sizes(self.max_batch_size) if self._bucketed else (1,):
            self._forward_np(self._zeros(size))
        self.startup_s["warm"] = time.perf_counter() - start
        start = time.perf_counter()
        self._gate()
        self.startup_s["gate"] = time.perf_counter() - start

    def validate(self, inputs: Tensors) -> None:
        self.base.validate(inputs)

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        return self.base.preprocess(inputs)

    def predict(self, batch: Any) -> Any:
        if not isinstance(batch, torch.Tensor):
            raise ValidationError(f"--runtime {self.choice.runtime} takes one tensor per "
                                  "request, not named tensors")
        assert self._backend is not None, "setup() first"
        rows = batch.shape[0]
        if self._bucketed:
            batch = pad_rows(batch, bucket_for(rows, self.max_batch_size))
        with torch.inference_mode():
            return unpad_rows(self._backend(batch), rows)

    def postprocess(self, outputs: Any, count: int) -> list[Tensors]:
        return self.base.postprocess(outputs, count)

    def info(self) -> dict[str, Any]:
        """What status and the heartbeat show: runtime, precision, accuracy, start-up."""
        return {"runtime": self.choice.runtime, "precision": self.choice.precision,
                "version": self.version, "providers": self.providers,
                "startup_s": {k: round(v, 3) for k, v in self.startup_s.items()},
                "accuracy": self.accuracy.as_dict() if self.accuracy else None,
                "tolerance": self.choice.tolerance_or_default}

    # --- building --------------------------------------------------------------

    def _zeros(self, rows: int) -> np.ndarray:
        spec = self._spec()
        return np.zeros((rows, *spec.shape), dtype=spec.dtype)

    def _spec(self) -> TensorSpec:
        assert self.input_spec is not None
        return self.input_spec

    def _build(self) -> Backend:
        module = self.base.module
        runtime, precision = self.choice.runtime, self.choice.precision
        if runtime == "onnx":
            return self._build_onnx()
        forward: Backend = module
        if runtime == "compile":
            # one graph per bucket: dynamo's default limit (8) is below log2(1024) + 1
            import torch._dynamo

            limit = len(bucket_sizes(self.max_batch_size)) + 2
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, limit)
            forward = torch.compile(module, dynamic=False)
        if precision in ("bf16", "fp16"):
            return _autocast(forward, self.device, precision)
        return forward

    def _build_onnx(self) -> Backend:
        sample = torch.from_numpy(self._zeros(2)).to(self.device)
        workdir = Path(tempfile.mkdtemp(prefix="batchfleet-onnx-"))
        try:
            session = build_session(None if self._onnx_file else self.base.module,
                                    self._onnx_file, sample, self.choice.precision,
                                    self.device, workdir)
        finally:  # the session holds the model in memory; the files can go
            shutil.rmtree(workdir, ignore_errors=True)
        self.providers = session.providers
        return _onnx_backend(session, self.device)

    def _forward_np(self, rows: np.ndarray) -> np.ndarray:
        out = self.predict(torch.from_numpy(rows).to(self.device))
        return np.asarray(out.detach().float().cpu().numpy())

    def _reference_np(self, rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self.base.module(torch.from_numpy(rows).to(self.device))
        return np.asarray(out.detach().float().cpu().numpy())

    def _gate(self) -> None:
        spec = self._spec()
        if self.choice.calibration is not None:
            rows = accuracy.load_calibration(self.choice.calibration, spec)
        else:
            rows = accuracy.seeded_rows(spec, value_range=self.input_range)
        self.accuracy = report = accuracy.measure(
            self._reference_np, self._forward_np, rows, self.max_batch_size)
        accuracy.check(self.name, self.choice.label, report,
                       self.choice.tolerance_or_default, self.choice.accept_accuracy_loss)


def _autocast(forward: Backend, device: torch.device, precision: str) -> Backend:
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16

    def run(batch: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype):
            return forward(batch)

    return run


def _onnx_backend(session: OnnxSession, device: torch.device) -> Backend:
    def run(batch: torch.Tensor) -> torch.Tensor:
        out = torch.from_numpy(session.run(batch.detach().cpu().numpy()))
        return out if device.type == "cpu" else out.to(device)

    return run


