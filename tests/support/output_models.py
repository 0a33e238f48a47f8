"""Canaries whose outputs are wrong without raising, for the output-statistics guard tests:
demo-mlp plus 0.3, and demo-mlp answering NaN for the requests carrying a marker."""

from __future__ import annotations

import torch
from torch import nn

from batchfleet.workers.models import TensorSpec, TorchModuleHandler
from batchfleet.workers.models.builtin import build_mlp

#: A demo-mlp input whose second feature is this value gets NaN from the NaN canary.
NAN_MARK = 3.25
SHIFT = 0.3


class Shifted(nn.Module):
    """demo-mlp's output plus :data:`SHIFT`."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + SHIFT  # type: ignore[no-any-return]


class NaNSome(nn.Module):
    """demo-mlp, NaN for the rows whose second feature is :data:`NAN_MARK`."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        marked = (x[:, 1] == NAN_MARK).unsqueeze(1)
        return torch.where(marked, torch.full_like(out, float("nan")), out)


def shifted_canary() -> TorchModuleHandler:
    """``--model demo-mlp@shifted=tests.support.output_models:shifted_canary``."""
    return TorchModuleHandler("shifted", Shifted(), input_spec=TensorSpec("float32", (10,)))


def nan_canary() -> TorchModuleHandler:
    """``--model demo-mlp@nan=tests.support.output_models:nan_canary``."""
    return TorchModuleHandler("nan", NaNSome(), input_spec=TensorSpec("float32", (10,)))
