"""A model version that is held in memory only while it is loaded (``--max-loaded-models``,
``--model-memory-mb``; docs/models.md, "Loading on demand").

:class:`ResidentHandler` stands in the worker's ``versions`` for the whole run: it keeps
what the fleet must know of a version whether it is loaded or not (``name``,
``version``, ``input_spec``), and delegates the batch hooks to the real handler while
one is loaded. :meth:`ResidentHandler.build` makes a fresh handler from the model's
spec, sets it up and warms it up (on a loader thread, never the compute thread), and
returns it unattached: the compute thread attaches it with :meth:`attach` and drops it
with :meth:`detach`, so the handler a forward uses never changes under it.

At start-up each version is built once, to learn its version hash and spec, and dropped
at once; only one such build is in memory at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from batchfleet.schemas.errors import ModelNotLoadedError
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.heap import collect_everything
from batchfleet.workers.models.handler import ModelHandler, preprocess_on_device


@dataclass(frozen=True, slots=True)
class Built:
    """A handler set up and warmed up, not yet attached; what it took."""

    handler: ModelHandler
    load_s: float
    warmup_s: float
    memory_mb: float


class ResidentHandler:
    """A version whose real handler comes and goes (see the module docstring)."""

    def __init__(self, name: str, make: Callable[[], ModelHandler], *, keep: bool = False,
                 tag: str = "", source: str = "", sample: str = "") -> None:
        self.name = name
        #: A ``.npy`` file holding one request's inputs to warm up with ("": zeros).
        self.sample = sample
        #: The repository version folder it serves ("" for a ``--model`` spec), and where
        #: it comes from (``batchfleet models list``).
        self.tag, self.source = tag, source
        #: Its model's last version left the repository: not served any more.
        self.removed = False
        self._make = make
        first = make()  # what the fleet must know of it, loaded or not
        self.version: str = self._versioned(first)
        self.input_spec: TensorSpec | None = first.input_spec
        #: Its parameters and buffers as built at start-up: what a load is expected to
        #: take until one measured it.
        self.estimate_mb = module_memory_mb(first)
        self._inner: ModelHandler | None = first if keep else None
        del first
        collect_everything()

    def _versioned(self, handler: ModelHandler) -> str:
        return f"{self.tag}/{handler.version}" if self.tag else handler.version

    def warmup_sample(self, path: str | None = None) -> Tensors | None:
        """The repository's warm-up sample (``path``, default its own): one request's
        inputs, as ``numpy.save`` wrote them (None: none given)."""
        path = self.sample if path is None else path
        return np.load(path, allow_pickle=False) if path else None

    def retarget(self, make: Callable[[], ModelHandler], tag: str, source: str,
                 probe: ModelHandler | None = None, sample: str = "") -> None:
        """Build from ``make`` from now on (a new repository version); what is loaded
        stays until the compute thread attaches the new build (:meth:`attach`). ``probe``
        (a build of it, not kept) says its version while it is not loaded."""
        self._make, self.tag, self.source, self.sample = make, tag, source, sample
        if probe is not None:
            self.version = self._versioned(probe)
            self.input_spec = probe.input_spec or self.input_spec

    @property
    def resident(self) -> bool:
        return self._inner is not None

    @property
    def preprocess_on_device(self) -> bool:
        return self._inner is not None and preprocess_on_device(self._inner)

    def build(self, device: torch.device, warmup_sizes: Sequence[int],
              make: Callable[[], ModelHandler] | None = None,
              sample: str | None = None) -> Built:
        """A fresh handler (from ``make``, default its own), set up on ``device`` and run
        at ``warmup_sizes`` (the batch sizes it will run) on its warm-up sample (``sample``,
        default its own; none: zeros of its input spec), so the first request pays for
        neither; on a loader thread."""
        cuda = device.type == "cuda"
        before = torch.cuda.memory_allocated(device) if cuda else 0
        start = time.perf_counter()
        handler = (make or self._make)()
        if handler.input_spec is None:
            handler.input_spec = self.input_spec  # adopted from ``models declare``
        handler.setup(device)
        loaded = time.perf_counter()
        row = self.warmup_sample(sample)
        if row is None and handler.input_spec is not None:
            row = handler.input_spec.zeros()
        if row is not None:
            for size in warmup_sizes:
                rows = [row] * size
                handler.postprocess(handler.predict(handler.preprocess(rows)), size)
        if cuda:
            torch.cuda.synchronize(device)
        warm = time.perf_counter()
        memory = ((torch.cuda.memory_allocated(device) - before) / 2**20 if cuda
                  else module_memory_mb(handler))
        return Built(handler, loaded - start, warm - loaded, max(memory, 0.0))

    def attach(self, handler: ModelHandler) -> None:
        """On the compute thread: serve ``handler`` from now on (between two batches, so a
        new version takes over from the old one with no batch split across them)."""
        self._inner = handler
        self.version = self._versioned(handler)
        self.input_spec = handler.input_spec or self.input_spec

    def detach(self) -> None:
        """On the compute thread, with no batch of this version in flight: let it go."""
        self._inner = None
        collect_everything()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _loaded(self) -> ModelHandler:
        if self._inner is None:
            raise ModelNotLoadedError(f"model {self.name!r} is not loaded")
        return self._inner

    def setup(self, device: torch.device) -> None:
        """A version kept from start-up is set up with the rest; one loaded on demand is
        set up when it is built (:meth:`build`)."""
        if self._inner is not None:
            self._inner.setup(device)

    def validate(self, inputs: Tensors) -> None:
        hook = getattr(self._inner, "validate", None)
        if hook is not None:
            hook(inputs)

    def preprocess(self, inputs: Sequence[Tensors]) -> Any:
        return self._loaded().preprocess(inputs)

    def predict(self, batch: Any) -> Any:
        return self._loaded().predict(batch)

    def postprocess(self, outputs: Any, count: int) -> list[Tensors]:
        return self._loaded().postprocess(outputs, count)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def module_memory_mb(handler: object, depth: int = 2) -> float:
    """MiB of parameters and buffers of the ``nn.Module`` a handler holds (itself, or an
    attribute of it, or of a handler it wraps); 0 when it holds none."""
    seen: set[int] = set()
    return sum(t.numel() * t.element_size() for t in _tensors(handler, depth, seen)) / 2**20


def _tensors(obj: object, depth: int, seen: set[int]) -> list[torch.Tensor]:
    if isinstance(obj, torch.nn.Module):
        found = [t for t in (*obj.parameters(), *obj.buffers()) if id(t) not in seen]
        seen.update(id(t) for t in found)
        return found
    if depth <= 0 or not hasattr(obj, "__dict__"):
        return []
    return [t for value in vars(obj).values() for t in _tensors(value, depth - 1, seen)]
