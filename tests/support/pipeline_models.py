"""Small seeded models for pipeline tests: chains of them compose locally to compare with."""

from __future__ import annotations

import torch
from torch import nn

from batchfleet.workers.models import TensorSpec, TorchModuleHandler


def build_mix(seed: int = 7) -> nn.Module:
    """float32[10] -> float32[10]: a seeded Linear then tanh, so chains stay in range."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(10, 10), nn.Tanh()).eval()


def mix() -> TorchModuleHandler:
    return TorchModuleHandler("mix", build_mix(), input_spec=TensorSpec("float32", (10,)))


def build_head(seed: int = 8) -> nn.Module:
    """float32[1] -> float32[1]: what follows demo-mlp (or the poison model) in a chain."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(1, 1).eval()


def head() -> TorchModuleHandler:
    return TorchModuleHandler("head", build_head(), input_spec=TensorSpec("float32", (1,)))


def mix2() -> TorchModuleHandler:
    """Another mix (another seed): the second model of an ensemble."""
    return TorchModuleHandler("mix2", build_mix(9), input_spec=TensorSpec("float32", (10,)))
