"""Built-in models, addressable by name with no code: ``demo-mlp`` and ``demo-encoder``.

Weights are drawn from a fixed seed inside ``torch.random.fork_rng`` so they
are reproducible and building a model never disturbs the caller's RNG.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from workers.models.handler import TensorSpec, TorchModuleHandler

MLP_SEED = 20240601
ENCODER_SEED = 20240602

ENCODER_SEQ_LEN = 64
ENCODER_VOCAB = 1024
ENCODER_DIM = 256
ENCODER_LAYERS = 4
ENCODER_OUTPUTS = 8


def build_mlp() -> nn.Module:
    """float32[10] -> float32[1]: Linear(10,64)-ReLU-Linear(64,32)-ReLU-Linear(32,1)-Sigmoid."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MLP_SEED)
        return nn.Sequential(
            nn.Linear(10, 64), nn.ReLU(),
            nn.Linear(64, 32), nn.ReLU(),
            nn.Linear(32, 1), nn.Sigmoid(),
        ).eval()


class DemoEncoder(nn.Module):
    """int64[64] token IDs -> float32[8]: a 4-layer d=256 TransformerEncoder, mean-pooled.

    Compute-bound on CPU, so it is the model performance work is measured on.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(ENCODER_VOCAB, ENCODER_DIM)
        self.position = nn.Parameter(torch.randn(ENCODER_SEQ_LEN, ENCODER_DIM) * 0.02)
        layer = nn.TransformerEncoderLayer(
            ENCODER_DIM, nhead=4, dim_feedforward=4 * ENCODER_DIM, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers=ENCODER_LAYERS, enable_nested_tensor=False
        )
        self.head = nn.Linear(ENCODER_DIM, ENCODER_OUTPUTS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens) + self.position)
        return self.head(hidden.mean(dim=1))  # type: ignore[no-any-return]


def build_encoder() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ENCODER_SEED)
        return DemoEncoder().eval()


def demo_mlp(name: str = "demo-mlp", max_batch_size: int = 1024) -> TorchModuleHandler:
    return TorchModuleHandler(
        name, build_mlp(), input_spec=TensorSpec("float32", (10,)),
        max_batch_size=max_batch_size,
    )


def demo_encoder(name: str = "demo-encoder", max_batch_size: int = 1024) -> TorchModuleHandler:
    return TorchModuleHandler(
        name, build_encoder(), input_spec=TensorSpec("int64", (ENCODER_SEQ_LEN,)),
        max_batch_size=max_batch_size,
    )


BUILTIN_MODELS: dict[str, Callable[[str, int], TorchModuleHandler]] = {
    "demo-mlp": demo_mlp,
    "demo-encoder": demo_encoder,
}
