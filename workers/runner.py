"""Running a model on a batch, isolating the requests that make it fail.

When a batch's forward raises, it is bisected: each half is retried on its
own until the failing request(s) are alone, so their neighbours still get
answers. The same split handles CUDA out-of-memory: smaller halves are tried
until they fit. This runs in the compute thread (a handler's ``preprocess``, unless it
copies to the device, runs before, on a thread of its own: ``prepare``); it never touches
the network.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from batchfleet.schemas.errors import BatchfleetError, ConfigError, ModelError, OutOfMemoryError
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
    message = useful_message(exc)
    if message != str(exc) and _TYPED.match(message):  # TorchScript's line names its type
        return ModelError(message)
    return ModelError(f"{type(exc).__name__}: {message}")


_TORCHSCRIPT_HEAD = "The following operation failed in the TorchScript interpreter."
_TYPED = re.compile(r"[A-Za-z_.]+: ")
#: torch.export's guard on a batch dimension exported static.
_EXPORT_BATCH_GUARD = re.compile(r"Guard failed: \w+\.size\(\)\[0\] == \d+")


def useful_message(exc: BaseException) -> str:
    """What a caller needs from a model's error. TorchScript's first line says only that
    it failed, then comes its traceback; the real error (``RuntimeError: mat1 and mat2
    shapes cannot be multiplied (2x5 and 10x4)``) is the last line, so that is kept,
    with the serialized line it failed on."""
    text = str(exc)
    if _EXPORT_BATCH_GUARD.search(text):
        return (f"{text} (this torch.export file takes only the batch size it was exported "
                "with: export it with dynamic_shapes giving dimension 0 a "
                "torch.export.Dim('batch'))")
    if not text.startswith(_TORCHSCRIPT_HEAD):
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    where = next((line for line in lines if line.startswith("File ")), "")
    return f"{lines[-1]} (in TorchScript{', ' + where if where else ''})"


def warmup_row(handler: ModelHandler) -> Tensors:
    """What a warm-up batch is made of: the handler's sample (a repository's
    ``warmup_sample``), else zeros of its input spec."""
    sample: Callable[[], Tensors | None] | None = getattr(handler, "warmup_sample", None)
    row = sample() if sample is not None else None
    if row is not None:
        return row
    assert handler.input_spec is not None
    return handler.input_spec.zeros()


@dataclass(slots=True)
class BatchRun:
    """Per-request outputs or errors, plus when and how long the compute took."""

    outputs: list[Tensors | BatchfleetError]
    started_at: float
    compute_s: float
    forwards: int
    #: It overran its compute limit and was abandoned (``workers.compute``).
    stalled: bool = False
    #: The thread its forward ran on (``threading.get_ident()``; 0 when none finished it).
    thread: int = 0


@dataclass(slots=True)
class Prepared:
    """A batch preprocessed ahead of its forward (``ModelRunner.prepare``)."""

    batch: Any
    #: ``time.time()`` when preprocessing finished, and how long it took.
    done_at: float
    took_s: float

    @property
    def started_at(self) -> float:
        return self.done_at - self.took_s


@dataclass(frozen=True, slots=True)
class _Failed:
    """``preprocess`` raised this on the whole batch."""

    error: BaseException


class ModelRunner:
    """Owns the handlers on one device: set-up, warm-up and batch execution."""

    def __init__(self, handlers: Mapping[str, ModelHandler], device: torch.device) -> None:
        self.handlers = dict(handlers)
        self.device = device

    def setup(self, warmup_batch_sizes: Sequence[int] = (1, 8)) -> dict[str, float]:
        """Move every model to the device and run warm-up batches; seconds taken per model.
        What a handler raises there is a ConfigError naming the model: it is not served."""
        took: dict[str, float] = {}
        for name, handler in self.handlers.items():
            if not getattr(handler, "resident", True):  # loaded later (models/lazy.py)
                continue
            start = time.perf_counter()
            try:
                handler.setup(self.device)
                spec = handler.input_spec
                if spec is not None:
                    row = warmup_row(handler)
                    for size in warmup_batch_sizes:
                        self._forward(handler, [row] * size)
            except BatchfleetError:
                raise
            except Exception as exc:  # user code: one line saying which model and why
                raise ConfigError(f"model {name!r}: set-up or warm-up (batches of "
                                  f"{', '.join(map(str, warmup_batch_sizes))}) failed: "
                                  f"{as_model_error(exc)}") from exc
            took[name] = time.perf_counter() - start
        return took

    def _forward(self, handler: ModelHandler, inputs: Sequence[Tensors]) -> list[Tensors]:
        return handler.postprocess(handler.predict(handler.preprocess(inputs)), len(inputs))

    def prepare(self, model: str, inputs: Sequence[Tensors]) -> Prepared:
        """``preprocess`` of a whole batch, on a thread other than the device's. What it
        raises is kept, not raised: :meth:`run` then bisects, preprocessing each part, so
        the request that made it fail is pinned as for a failed forward."""
        start = time.perf_counter()
        try:
            batch: Any = self.handlers[model].preprocess(inputs)
        except Exception as exc:
            batch = _Failed(exc)
        return Prepared(batch, time.time(), time.perf_counter() - start)

    def run(self, model: str, inputs: Sequence[Tensors],
            prepared: Prepared | None = None) -> BatchRun:
        """The batch's outputs, bisecting on failure. With ``prepared`` (the whole batch,
        preprocessed already), its forward is tried first; a failure there re-runs the
        parts from their inputs."""
        handler = self.handlers[model]
        forwards = 0 if prepared is None or isinstance(prepared.batch, _Failed) else 1

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
        if prepared is None:
            raw = bisect_run(forward, inputs)
        else:
            raw = self._run_prepared(handler, inputs, prepared.batch, forward)
        compute_s = time.perf_counter() - start
        if prepared is not None:  # the request's compute time includes its preprocessing
            started_at, compute_s = prepared.started_at, compute_s + prepared.took_s
        outputs: list[Tensors | BatchfleetError] = [
            as_model_error(o) if isinstance(o, BaseException) else o for o in raw
        ]
        return BatchRun(outputs, started_at, compute_s, forwards, thread=threading.get_ident())

    @staticmethod
    def _run_prepared(handler: ModelHandler, inputs: Sequence[Tensors], batch: Any,
                      forward: Callable[[Sequence[Tensors]], list[Tensors]]
                      ) -> list[Tensors | BaseException]:
        """The forward of a preprocessed batch; on failure (of it, or of ``preprocess``
        already), its halves are bisected from their inputs, as :func:`bisect_run` would."""
        error: BaseException
        if isinstance(batch, _Failed):
            error = batch.error
        else:
            try:
                return list(handler.postprocess(handler.predict(batch), len(inputs)))
            except Exception as exc:
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
                error = exc
        if len(inputs) <= 1:
            return [error]
        mid = len(inputs) // 2
        return bisect_run(forward, inputs[:mid]) + bisect_run(forward, inputs[mid:])
