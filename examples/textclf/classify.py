"""Classify a few texts with the textclf worker (docs/models.md)."""

import os

from textclf.model import LABELS, encode

from batchfleet import Client

texts = ["I love it, works great", "terrible, it broke after a day"]
with Client(os.environ.get("BATCHFLEET_BROKER", "redis://localhost:6379/0")) as client:
    ids = client.submit_many("textclf", [encode(text) for text in texts])
    for text, result in zip(texts, client.wait_many(ids, timeout=30), strict=True):
        assert result.status == "succeeded", result.error
        label = LABELS[int(result.outputs.argmax())]
        print(f"{label:8}  {text!r}  ({result.compute_ms:.1f} ms compute)")
