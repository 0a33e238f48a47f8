"""Built-in models, addressable by name with no code: ``demo-mlp``, ``demo-encoder`` and
``demo-tokenize`` (a CPU preprocessing step for pipelines: text bytes to demo-encoder's
token IDs).

Weights are drawn from a fixed seed inside ``torch.random.fork_rng`` so they
are reproducible and building a model never disturbs the caller's RNG. A spec
may name another seed (``demo-mlp:seed=2``): a different network with the same
specs, which is how rollouts are tried without training anything.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from batchfleet.schemas.errors import InvalidInputError
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.tensors import Tensors
from batchfleet.workers.models.handler import TorchModuleHandler

MLP_SEED = 20240601
ENCODER_SEED = 20240602

ENCODER_SEQ_LEN = 64
ENCODER_VOCAB = 1024
ENCODER_DIM = 256
ENCODER_LAYERS = 4
ENCODER_OUTPUTS = 8


def build_mlp(seed: int = MLP_SEED) -> nn.Module:
    """float32[10] -> float32[1]: Linear(10,64)-ReLU-Linear(64,32)-ReLU-Linear(32,1)-Sigmoid."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
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


def build_encoder(seed: int = ENCODER_SEED) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DemoEncoder().eval()


def check_tokens(inputs: Tensors) -> None:
    """demo-encoder's domain: token IDs in ``[0, vocab)``; others would raise inside the
    embedding (an IndexError) on every attempt, so they are refused at intake."""
    tokens = np.asarray(inputs)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= ENCODER_VOCAB):
        bad = tokens[(tokens < 0) | (tokens >= ENCODER_VOCAB)]
        raise InvalidInputError(
            f"token IDs must be in [0, {ENCODER_VOCAB}); got {bad.size} outside it "
            f"(e.g. {int(bad[0])})")


#: demo-tokenize's input: UTF-8 text, zero-padded (or cut) to this many bytes.
TOKENIZE_BYTES = 4 * ENCODER_SEQ_LEN


class DemoTokenize(nn.Module):
    """uint8[256] text bytes -> int64[64] token IDs in ``[0, 1024)``: each 4-byte window
    hashed (a polynomial, mod the vocabulary). No weights: a preprocessing step, light on
    CPU, whose output is demo-encoder's input, so the two make a pipeline."""

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        windows = text.long().reshape(text.shape[0], ENCODER_SEQ_LEN, 4)
        weights = torch.tensor([29791, 961, 31, 1], dtype=torch.long)
        return (windows * weights).sum(dim=2) % ENCODER_VOCAB


def text_bytes(text: str) -> np.ndarray:
    """A demo-tokenize input from a string."""
    raw = text.encode()[:TOKENIZE_BYTES]
    return np.frombuffer(raw.ljust(TOKENIZE_BYTES, b"\0"), dtype=np.uint8).copy()


def demo_mlp(name: str = "demo-mlp", max_batch_size: int = 1024,
             seed: int = MLP_SEED) -> TorchModuleHandler:
    return TorchModuleHandler(
        name, build_mlp(seed), input_spec=TensorSpec("float32", (10,)),
        max_batch_size=max_batch_size,
    )


def demo_encoder(name: str = "demo-encoder", max_batch_size: int = 1024,
                 seed: int = ENCODER_SEED) -> TorchModuleHandler:
    return TorchModuleHandler(
        name, build_encoder(seed), input_spec=TensorSpec("int64", (ENCODER_SEQ_LEN,)),
        max_batch_size=max_batch_size, validator=check_tokens,
        input_range=(0, ENCODER_VOCAB),
    )


def demo_tokenize(name: str = "demo-tokenize", max_batch_size: int = 1024,
                  seed: int = 0) -> TorchModuleHandler:
    """``seed`` is accepted for a uniform signature; the tokenizer has no weights."""
    return TorchModuleHandler(
        name, DemoTokenize(), input_spec=TensorSpec("uint8", (TOKENIZE_BYTES,)),
        max_batch_size=max_batch_size,
    )


#: Each takes (name, max_batch_size, seed); ``demo-mlp:seed=2`` is another network.
BUILTIN_MODELS: dict[str, Callable[..., TorchModuleHandler]] = {
    "demo-mlp": demo_mlp,
    "demo-encoder": demo_encoder,
    "demo-tokenize": demo_tokenize,
}
