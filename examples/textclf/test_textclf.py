"""Testing the handler: its hooks on whole batches, as the worker calls them."""

import numpy as np
import pytest
import torch
from textclf.model import LABELS, build, encode

from batchfleet import InvalidInputError


def test_it_classifies_a_batch() -> None:
    handler = build()
    handler.setup(torch.device("cpu"))
    texts = ["works great, love it", "awful, it broke"]
    outputs = handler.postprocess(handler.predict(handler.preprocess(
        [encode(t) for t in texts])), len(texts))
    assert [LABELS[int(np.argmax(o))] for o in outputs] == ["positive", "negative"]


def test_it_refuses_bytes_that_are_not_text() -> None:
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        build().validate(np.full(256, 0xFF, np.uint8))
