"""A demo-mlp that counts the rows its forward sees: what the result cache must save."""

from __future__ import annotations

import threading

import torch
from torch import nn

from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from batchfleet.workers.models.builtin import build_mlp


class Counting(nn.Module):
    """demo-mlp, noting each computed row's first feature (warm-up rows are all zeros)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()
        self._lock = threading.Lock()
        self.seen: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:  # the compute thread writes, the test reads
            self.seen += [float(v) for v in x[:, 0].tolist()]
        return self.inner(x)  # type: ignore[no-any-return]

    def rows(self) -> list[float]:
        """The computed rows' first features, warm-up left out."""
        with self._lock:
            return [v for v in self.seen if v != 0.0]


def counting_model(module: Counting, name: str = "counting") -> TorchModuleHandler:
    return TorchModuleHandler(name, module, input_spec=TensorSpec("float32", (10,)))
