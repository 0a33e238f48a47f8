"""``batchfleet models check``: load one model as a worker would, with no broker, and try it.

What a new user needs before deploying a handler: does it load (and how long does that
take), does its warm-up run, do sample inputs pass its specs and ``validate`` hook, how
many outputs come back and what they look like, and how long a batch takes at a few
sizes. It runs the worker's own code for each step (:func:`load_model`,
:class:`ModelRunner`, :func:`validate_request`), so what passes here passes in a worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchfleet.schemas.errors import ConfigError, OutputMismatchError
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.models.builtin import BUILTIN_MODELS
from batchfleet.workers.models.handler import ModelHandler, validate_request
from batchfleet.workers.models.loading import load_model, split_model_spec
from batchfleet.workers.runner import ModelRunner

#: Batch sizes timed when none are given (each capped by ``max_batch_size``).
DEFAULT_SIZES = (1, 8, 32)


@dataclass(slots=True)
class CheckReport:
    """What ``models check`` prints (``-o json``: :meth:`as_dict`)."""

    model: str
    version: str
    input_spec: TensorSpec | None
    output_spec: TensorSpec | None
    load_s: float
    setup_s: float
    inputs: int
    outputs: list[Tensors]
    #: batch size -> median seconds per batch (preprocess to postprocess).
    batch_s: dict[int, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version,
                "input_spec": self.input_spec.describe() if self.input_spec else None,
                "output_spec": self.output_spec.describe() if self.output_spec else None,
                "load_s": round(self.load_s, 4), "setup_s": round(self.setup_s, 4),
                "inputs": self.inputs, "outputs": [_plain(o) for o in self.outputs],
                "batch_ms": {str(k): round(v * 1000, 3) for k, v in self.batch_s.items()}}


def named_spec(spec: str) -> str:
    """``SPEC`` as on ``worker --model``, given a name where it has none: a built-in is its
    own name; ``textclf.model:build`` is ``textclf``; ``path/net.pt`` is ``net``."""
    base = spec.partition(":")[0]
    if base in BUILTIN_MODELS:
        return f"{base}={spec}"
    if "=" in spec:
        return spec
    path = Path(spec)
    is_file = path.suffix in _FILE_SUFFIXES or path.exists()
    stem = path.stem if is_file else base.partition(".")[0]
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem).strip("-_")
    return f"{name or 'model'}={spec}"


_FILE_SUFFIXES = (".pt", ".pt2", ".pth", ".ts", ".onnx")


def read_inputs(path: Path) -> list[Tensors]:
    """Sample inputs from a file: ``.npy`` (a batch: one row per request) or ``.json`` (a
    list of requests' inputs, each a nested list; or one request)."""
    if not path.exists():
        raise ConfigError(f"--input-file {path}: no such file")
    if path.suffix == ".npy":
        batch = np.load(path, allow_pickle=False)
        return list(batch) if batch.ndim else [batch]
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list) or not rows:
            raise ConfigError(f"--input-file {path}: expected a JSON list of inputs")
        if not isinstance(rows[0], list):
            rows = [rows]
        return [np.asarray(r) for r in rows]
    raise ConfigError(f"--input-file {path}: expected a .npy batch or a .json list")


def sample_inputs(spec: TensorSpec, rows: int = 4, seed: int = 0,
                  value_range: tuple[float, float] | None = None) -> list[Tensors]:
    """Seeded rows of ``spec``: floats from a normal, whole numbers within ``value_range``
    (a handler's ``input_range``) or ``[0, 10)``, booleans at random."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(spec.dtype)
    shape = (rows, *spec.shape)
    if dtype.kind == "f":
        batch = rng.standard_normal(shape).astype(dtype)
    elif dtype.kind == "b":
        batch = rng.random(shape) < 0.5
    else:
        low, high = value_range or (0, 10)
        batch = rng.integers(int(low), int(high), shape).astype(dtype)
    return list(batch)


def check_model(spec: str, *, input_spec: TensorSpec | None = None,
                inputs: Sequence[Tensors] | None = None, device: str = "cpu",
                batch_sizes: Sequence[int] = DEFAULT_SIZES, max_batch_size: int = 64,
                repeats: int = 5) -> CheckReport:
    """Load, set up and warm ``spec``, run one batch of ``inputs`` (or rows generated from
    its spec) through the specs and hooks, then time batches. Raises ConfigError when
    there is nothing to run it on, and the model's own errors as a worker would see them."""
    parsed = split_model_spec(named_spec(spec))
    start = time.perf_counter()
    handler = load_model(named_spec(spec), max_batch_size, input_spec=input_spec)
    load_s = time.perf_counter() - start
    if inputs is None:
        if handler.input_spec is None:
            raise ConfigError(
                f"model {parsed.name!r} does not say what it takes: pass --input-spec "
                "DTYPE[SHAPE] (e.g. float32[10]) or --input-file FILE (.npy or .json)")
        inputs = sample_inputs(handler.input_spec,
                               value_range=getattr(handler, "input_range", None))
    runner = ModelRunner({parsed.name: handler}, torch.device(device))
    setup_s = runner.setup()[parsed.name]
    for row in inputs:
        validate_request(handler, row)
    run = runner.run(parsed.name, list(inputs))
    failed = next((o for o in run.outputs if isinstance(o, Exception)), None)
    if failed is not None:
        raise failed
    outputs: list[Tensors] = [o for o in run.outputs if not isinstance(o, Exception)]
    output_spec = _output_spec(handler)
    if output_spec is not None:
        for out in outputs:
            try:
                output_spec.check(out)
            except Exception as exc:
                raise OutputMismatchError(f"output_spec {output_spec.describe()}: {exc}") from exc
    report = CheckReport(parsed.name, handler.version, handler.input_spec, output_spec,
                         load_s, setup_s, len(inputs), outputs)
    for size in sorted({min(s, max_batch_size) for s in batch_sizes if s > 0}):
        batch = [inputs[i % len(inputs)] for i in range(size)]
        report.batch_s[size] = _median_batch_s(runner, parsed.name, batch, repeats)
    return report


def _output_spec(handler: ModelHandler) -> TensorSpec | None:
    spec = getattr(handler, "output_spec", None)
    return spec if isinstance(spec, TensorSpec) else None


def _median_batch_s(runner: ModelRunner, model: str, batch: list[Tensors],
                    repeats: int) -> float:
    took = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        runner.run(model, batch)
        took.append(time.perf_counter() - start)
    return float(np.median(took))


def _plain(value: Tensors) -> Any:
    if isinstance(value, dict):
        return {k: np.asarray(v).tolist() for k, v in value.items()}
    return np.asarray(value).tolist()
