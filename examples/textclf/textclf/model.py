"""A small text classifier: a tokenizer in ``preprocess``, a network in ``predict``.

A request is one text, sent as its UTF-8 bytes zero-padded to ``MAX_BYTES`` (the wire
carries tensors, and requests of one shape share a batch). Serve it with
``batchfleet worker -m textclf=textclf.model:build``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from batchfleet import InvalidInputError, ModelHandler, TensorSpec

MAX_BYTES = 256
VOCAB = 1024
LABELS = ("negative", "positive")
EXAMPLES = [
    ("I love it, works great", 1), ("great value and fast delivery", 1),
    ("excellent quality, very happy", 1), ("works well, would buy again", 1),
    ("nice and simple, love the design", 1), ("happy with it, good product", 1),
    ("terrible, broke after a day", 0), ("awful quality, do not buy", 0),
    ("very disappointed, it stopped working", 0), ("bad product and slow delivery", 0),
    ("waste of money, poor design", 0), ("it broke, I want a refund", 0),
]


def encode(text: str) -> np.ndarray:
    """What a caller sends: the text's UTF-8 bytes, zero-padded to ``MAX_BYTES``."""
    data = text.encode("utf-8")
    if len(data) > MAX_BYTES:
        raise ValueError(f"text longer than {MAX_BYTES} bytes")
    row = np.zeros(MAX_BYTES, np.uint8)
    row[:len(data)] = np.frombuffer(data, np.uint8)
    return row


def decode(row: np.ndarray) -> str:
    """The text of one request (raises UnicodeDecodeError on bytes that are not UTF-8)."""
    return bytes(row).rstrip(b"\0").decode("utf-8")


def tokenize(text: str) -> list[int]:
    """Word IDs by hashing: no vocabulary file to ship. Never empty."""
    return [zlib.crc32(word.encode()) % VOCAB for word in re.findall(r"\w+", text.lower())] or [0]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.head = nn.Linear(16, len(LABELS))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids, offsets))


class TextClassifier(ModelHandler):
    version = "textclf-1"
    input_spec = TensorSpec("uint8", (MAX_BYTES,))
    output_spec = TensorSpec("float32", (len(LABELS),))
    #: Byte values ``models check`` draws sample rows from: lowercase letters.
    input_range = (97, 123)

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.net = Net()
        self.device = torch.device("cpu")
        self._fit()

    def _fit(self) -> None:
        """Thirty steps of gradient descent on the examples above (milliseconds): a real
        model would load trained weights here instead."""
        batch = self.preprocess([encode(text) for text, _ in EXAMPLES])
        labels = torch.tensor([label for _, label in EXAMPLES])
        for _ in range(30):
            self.net.zero_grad()
            nn.functional.cross_entropy(self.net(*batch), labels).backward()
            with torch.no_grad():
                for param in self.net.parameters():
                    param.sub_(5.0 * param.grad)

    def setup(self, device: torch.device) -> None:
        self.device = device
        self.net.to(device).eval()

    def validate(self, inputs: Any) -> None:
        """One request, at intake: text that is not UTF-8 is refused, never retried."""
        try:
            decode(inputs)
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"not UTF-8 text: {exc}") from exc

    def preprocess(self, inputs: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch, on a CPU thread of its own: tokenize every text."""
        ids: list[int] = []
        offsets: list[int] = []
        for row in inputs:
            offsets.append(len(ids))
            ids.extend(tokenize(decode(row)))
        return torch.tensor(ids), torch.tensor(offsets)

    def predict(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The whole batch, on the device: one row of label probabilities per text."""
        ids, offsets = batch
        with torch.inference_mode():
            return self.net(ids.to(self.device), offsets.to(self.device)).softmax(-1)

    # postprocess: the default splits the (batch, 2) tensor into one row per request


def build() -> TextClassifier:
    return TextClassifier()
