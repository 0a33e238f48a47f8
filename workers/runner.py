"""Running a model on a batch, isolating the requests that make it fail.

When a batch's forward raises, it is bisected: each half is retried on its
own until the failing request(s) are alone, so their neighbours still get
answers. The same split handles CUDA out-of-memory: smaller halves are tried
until they fit. This runs in the compute thread; it never touches the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from batchfleet.schemas.errors import BatchfleetError, ModelError, OutOfMemoryError
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.models.handler import ModelHandler

T = TypeVar("T")
R = TypeVar("R")


def bisect_run(
    run: Callable[[Sequence[T]], list[R]], items: Sequence[T]
) -> list[R | BaseException]:
    """``run(items)``; on failure split in halves and recurse, so one bad item fails alone."""
    try:
        return list(run(items))
    except Exception as exc:
        if len(items) <= 1:
            return [exc]
        mid = len(items) // 2
        return bisect_run(run, items[:mid]) + bisect_run(run, items[mid:])


def as_model_error(exc: BaseException) -> BatchfleetError:
    """Classify what a model raised: ours pass through, OOM is its own type, else ModelError."""
    if isinstance(exc, BatchfleetError):
        return exc
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return OutOfMemoryError(f"out of memory: {exc}")
    return ModelError(f"{type(exc).__name__}: {exc}")


@dataclass(slots=True)
class BatchRun:
    """Per-request outputs or errors, plus when and how long the compute took."""

    outputs: list[Tensors | BatchfleetError]
    started_at: float
    compute_s: float
    forwards: int
    #: It overran its compute limit and was abandoned (``workers.compute``).
    stalled: bool = False


class ModelRunner:
    """Owns the handlers on one device: set-up, warm-up and batch execution."""

    def __init__(self, handlers: Mapping[str, ModelHandler], device: torch.device) -> None:
        self.handlers = dict(handlers)
        self.device = device

    def setup(self, warmup_batch_sizes: Sequence[int] = (1, 8)) -> dict[str, float]:
        """Move every model to the device and run warm-up batches; seconds taken per model."""
        took: dict[str, float] = {}
        for name, handler in self.handlers.items():
            start = time.perf_counter()
            handler.setup(self.device)
            spec = handler.input_spec
            if spec is not None:
                for size in warmup_batch_sizes:
                    sample = np.zeros(spec.shape, dtype=spec.dtype)
                    self._forward(handler, [sample] * size)
            took[name] = time.perf_counter() - start
        return took

    def _forward(self, handler: ModelHandler, inputs: Sequence[Tensors]) -> list[Tensors]:
        return handler.postprocess(handler.predict(handler.preprocess(inputs)), len(inputs))

    def run(self, model: str, inputs: Sequence[Tensors]) -> BatchRun:
        handler = self.handlers[model]
        forwards = 0

        def forward(part: Sequence[Tensors]) -> list[Tensors]:
            nonlocal forwards
            forwards += 1
            try:
                return self._forward(handler, part)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                raise

        started_at = time.time()
        start = time.perf_counter()
        raw = bisect_run(forward, inputs)
        compute_s = time.perf_counter() - start
        outputs: list[Tensors | BatchfleetError] = [
            as_model_error(o) if isinstance(o, BaseException) else o for o in raw
        ]
        return BatchRun(outputs, started_at, compute_s, forwards)
