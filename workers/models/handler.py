"""The model handler contract (public) and the handler that wraps any ``torch.nn.Module``.

A handler has explicit hooks, as in LitServe: ``setup(device)`` once, then per
batch ``preprocess`` (requests into what the model takes, on a thread of its own),
``predict`` (on the device's thread) and ``postprocess`` (split back into one
output per request). An optional ``input_spec`` lets the worker refuse a wrong dtype or shape per
request before it can poison a batch, and an optional ``validate(inputs)`` hook
refuses values the spec cannot express (a token ID past the vocabulary): both
run at intake, one request at a time, so bad input fails alone and is never
retried. The user's guide to all of it: docs/models.md.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from batchfleet.schemas.errors import (
    ConfigError,
    InvalidInputError,
    OutputMismatchError,
    SchemaError,
    ValidationError,
)
from batchfleet.schemas.tensor_spec import TensorSpec  # also importable from here
from batchfleet.schemas.tensors import Array, Tensors, signature
from batchfleet.workers.models.staging import PinnedStaging


def check_inputs(spec: TensorSpec | None, inputs: Tensors) -> None:
    """Raise a ValidationError naming the mismatch; a no-op for models without a spec."""
    if spec is None:
        return
    if isinstance(inputs, dict):
        raise ValidationError(f"expected a single tensor {spec.describe()}, got named tensors")
    if signature(inputs) == spec.signature:
        return
    if np.dtype(inputs.dtype) != np.dtype(spec.dtype):
        hint = ""
        if np.dtype(inputs.dtype).kind in "iu" and np.dtype(spec.dtype).kind == "f":
            # JSON whole numbers become int64 on every front door: say how to send floats.
            hint = (f" (whole numbers are sent as {inputs.dtype}: send floats, run with "
                    f"--dtype {spec.dtype}, or set \"dtype\": \"{spec.dtype}\" over HTTP)")
        raise ValidationError(f"wrong dtype: expected {spec.dtype}, got {inputs.dtype}{hint}")
    raise ValidationError(
        f"wrong shape: expected {spec.describe()}, got {inputs.dtype}{list(inputs.shape)}"
    )


def validate_request(handler: ModelHandler, inputs: Tensors) -> None:
    """Everything intake can check about one request's inputs: the spec, then the handler's
    own ``validate`` hook where it has one. Whatever the hook raises refuses the request
    (as an :class:`InvalidInputError` unless it is already a validation error)."""
    check_inputs(handler.input_spec, inputs)
    run_validate_hook(handler, inputs)


def run_validate_hook(handler: ModelHandler, inputs: Tensors) -> None:
    """The handler's ``validate`` hook, if it has one (see :func:`validate_request`)."""
    hook = validate_hook(handler)
    if hook is not None:
        call_validate_hook(hook, inputs)


def validate_hook(handler: ModelHandler) -> Callable[[Tensors], object] | None:
    """The handler's ``validate`` hook or None. Looked up once per fetch, not per request:
    a missing attribute costs an ``AttributeError`` inside ``getattr`` (a wrapping
    handler's ``__getattr__`` more), which was 6% of demo-mlp's worker CPU."""
    hook: Callable[[Tensors], object] | None = getattr(handler, "validate", None)
    return hook


def call_validate_hook(hook: Callable[[Tensors], object], inputs: Tensors) -> None:
    """Run a ``validate`` hook; anything but a schema error it raises is invalid input."""
    try:
        hook(inputs)
    except SchemaError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"{type(exc).__name__}: {exc}") from exc


@runtime_checkable
class ModelHandler(Protocol):
    """What a worker needs from a model (public: ``from batchfleet import ModelHandler``).

    A factory given as ``--model NAME=module:factory`` returns one of these (or a plain
    ``nn.Module``, wrapped in :class:`TorchModuleHandler`). Subclass it to inherit the
    defaults below, or write any class with the same members. Every hook but ``setup``
    and ``validate`` sees a whole batch (docs/models.md):

    * ``setup(device)``: once, before serving: load weights, move them to ``device``;
    * ``preprocess(inputs)``: the batch's requests (a list of arrays, or of dicts of
      arrays) into whatever ``predict`` takes. It runs on a thread of its own *before*
      the device is taken, so CPU work here (tokenising, decoding, resizing) neither
      blocks the event loop nor holds the device; move tensors to the device in
      ``predict``. (A handler whose ``preprocess`` itself copies to the device sets
      ``preprocess_on_device = True``: it then runs in the compute thread.)
    * ``predict(batch)``: the forward, on the compute thread that owns the device;
    * ``postprocess(outputs, count)``: one output per request (``count`` of them);
    * ``validate(inputs)`` (optional): one request's inputs at intake, after the
      ``input_spec`` check and before it can join a batch. Raise
      :class:`~batchfleet.schemas.errors.InvalidInputError` to refuse input outside the
      model's domain: the request fails at once with a ``validation_error`` and is never
      retried. ``preprocess`` and ``predict`` may raise it too, for input only the model
      can judge: bisection pins it on the request, which fails once and does not count
      against the model's breaker.

    ``input_spec`` (a :class:`TensorSpec`, or None for no check) makes intake refuse a
    request of another dtype or shape; ``output_spec`` (optional) is what ``batchfleet
    models check`` holds the outputs to. ``version`` is stamped on every result.
    """

    name: str = ""
    version: str = "0"
    input_spec: TensorSpec | None = None

    def setup(self, device: torch.device) -> None:
        """Load and place the model on ``device`` (default: nothing to do)."""
        return None  # a body, so that subclasses need not write one (mypy: not abstract)

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        """Default: stack the requests into one CPU tensor (a dict of them for named
        inputs)."""
        return stack_rows(inputs)

    def predict(self, batch: Any) -> Any: ...

    def postprocess(self, outputs: Any, count: int) -> list[Tensors]:
        """Default: split a batched tensor (dict, tuple) into one output per request."""
        return split_rows(outputs, count)


def stack_rows(inputs: Sequence[Tensors]) -> Any:
    """The requests of a batch as one tensor (or a dict of them), on the CPU."""
    first = inputs[0]
    if isinstance(first, dict):
        return {key: torch.from_numpy(np.stack([x[key] for x in inputs]))
                for key in first}
    return torch.from_numpy(np.stack(inputs))  # type: ignore[arg-type]


def preprocess_on_device(handler: ModelHandler) -> bool:
    """Whether ``handler.preprocess`` copies to the device (so runs in the compute thread)."""
    return bool(getattr(handler, "preprocess_on_device", False))


def weights_version(module: torch.nn.Module) -> str:
    """A short content hash of the weights: the version stamped on every result."""
    digest = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return "sha256:" + digest.hexdigest()[:12]


def split_rows(outputs: Any, count: int) -> list[Tensors]:
    """One output per request from a batched tensor, dict or tuple of tensors."""
    if isinstance(outputs, torch.Tensor):
        arr = outputs.detach().cpu().numpy()
        if arr.ndim == 0 or arr.shape[0] != count:
            raise OutputMismatchError(
                f"model returned {0 if arr.ndim == 0 else arr.shape[0]} outputs "
                f"for {count} inputs"
            )
        return list(arr)
    if isinstance(outputs, dict):
        columns = {str(k): split_rows(v, count) for k, v in outputs.items()}
        rows: list[Tensors] = []
        for i in range(count):
            row: dict[str, Array] = {}
            for k, col in columns.items():
                value = col[i]
                row[k] = value if isinstance(value, np.ndarray) else np.asarray(value)
            rows.append(row)
        return rows
    if isinstance(outputs, tuple | list) and all(isinstance(o, torch.Tensor) for o in outputs):
        return split_rows({f"output_{i}": o for i, o in enumerate(outputs)}, count)
    raise OutputMismatchError(
        f"model returned {type(outputs).__name__}; expected a tensor, dict or tuple of tensors"
    )


class TorchModuleHandler:
    """Runs an ``nn.Module`` on whole batches under ``torch.inference_mode``.

    On CUDA, requests are stacked into pinned host buffers (two, used in turn, so
    the next batch's copy never overwrites one still in flight) and moved with
    ``non_blocking=True``. ``autocast`` picks a reduced precision on CUDA only.
    Collating is a copy to the device, ordered with its work: ``preprocess`` runs in
    the compute thread.
    """

    preprocess_on_device = True

    def __init__(
        self,
        name: str,
        module: torch.nn.Module,
        *,
        version: str | None = None,
        input_spec: TensorSpec | None = None,
        autocast: bool = False,
        max_batch_size: int = 1024,
        validator: Callable[[Tensors], None] | None = None,
        input_range: tuple[float, float] | None = None,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"model {name!r}: expected a torch.nn.Module, got {type(module)}")
        self.name = name
        self.module = module
        self.version = version or weights_version(module)
        self.input_spec = input_spec
        self.autocast = autocast
        self.validator = validator
        #: Where valid inputs lie (token IDs: ``[0, vocab)``), for seeded calibration rows.
        self.input_range = input_range
        self.device = torch.device("cpu")
        self._staging = PinnedStaging(max_batch_size)

    def setup(self, device: torch.device) -> None:
        self.device = device
        self.module.to(device)
        with contextlib.suppress(NotImplementedError):  # torch.export modules: no eval()
            self.module.eval()
        self._staging.enabled = device.type == "cuda"

    def validate(self, inputs: Tensors) -> None:
        """The ``validate`` hook: the ``validator`` given at construction, if any."""
        if self.validator is not None:
            self.validator(inputs)

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        first = inputs[0]
        if isinstance(first, dict):
            return {
                key: self._to_device([x[key] for x in inputs])
                for key in first
            }
        return self._to_device(inputs)  # type: ignore[arg-type]

    def _to_device(self, arrays: Sequence[Array]) -> torch.Tensor:
        host = self._staging.stack(arrays)
        if self.device.type == "cpu":
            return host
        return host.to(self.device, non_blocking=True)

    def predict(self, batch: Any) -> Any:
        with torch.inference_mode():
            if self.autocast and self.device.type == "cuda":
                with torch.autocast("cuda", dtype=torch.float16):
                    return self._call(batch)
            return self._call(batch)

    def _call(self, batch: Any) -> Any:
        return self.module(**batch) if isinstance(batch, dict) else self.module(batch)

    def postprocess(self, outputs: Any, count: int) -> list[Tensors]:
        if isinstance(outputs, torch.Tensor) and outputs.dtype in (torch.float16, torch.bfloat16):
            outputs = outputs.float()
        return split_rows(outputs, count)
