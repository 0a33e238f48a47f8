"""The naive RQ baseline's job: one request per RQ job, same model as the fleet.

RQ imports jobs by dotted path, so the function lives at module level. The
model is built on the first call and cached for the life of the process, so
a long-lived worker (``SimpleWorker``) pays for it once, as batchfleet's
worker does. ``PreloadedForkWorker`` builds it before forking, so RQ's
default fork-per-job worker is not charged a model build per job either.
"""

from __future__ import annotations

from typing import Any

from rq.worker import Worker

_models: dict[str, Any] = {}


def _mlp() -> Any:
    model = _models.get("demo-mlp")
    if model is None:
        from batchfleet.workers.models.builtin import build_mlp

        model = _models["demo-mlp"] = build_mlp()
    return model


def predict_one(inputs: list[float]) -> list[float]:
    """One demo-mlp forward for one request: what a naive RQ deployment does per job."""
    import torch

    with torch.inference_mode():
        out = _mlp()(torch.tensor([inputs], dtype=torch.float32))
    return [float(v) for v in out[0]]


class PreloadedForkWorker(Worker):
    """RQ's default fork-per-job worker, with the model built in the parent before any fork."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _mlp()
