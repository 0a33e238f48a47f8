"""Classify a few texts with the textclf worker, and send one it refuses (docs/models.md)."""

import os

import numpy as np
from textclf.model import LABELS, encode

from batchfleet import Client

texts = ["I love it, works great", "terrible, it broke after a day"]
with Client(os.environ.get("BATCHFLEET_BROKER", "redis://localhost:6379/0")) as client:
    ids = client.submit_many("textclf", [encode(text) for text in texts])
    for text, result in zip(texts, client.wait_many(ids, timeout=30), strict=True):
        assert result.status == "succeeded", result.error
        label = LABELS[int(np.argmax(result.outputs))]
        print(f"{label:8}  {text!r}  ({result.compute_ms:.1f} ms compute)")
    # bytes that are not UTF-8: the handler's validate hook refuses them at intake
    refused = client.wait(client.submit("textclf", np.full(256, 0xFF, np.uint8)), timeout=30)
    assert refused.error is not None
    print(refused.status, refused.error.type, f"attempts={refused.attempts}",
          refused.error.message)
