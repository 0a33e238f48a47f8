"""Results as JSON: the one shape the CLI's ``--json``, the gateway and webhooks share.

Tensors become (nested) lists; everything else is the result envelope's fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from schemas.envelopes import Result


def tensors_to_json(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {k: tensors_to_json(v) for k, v in value.items()}
    return np.asarray(value).tolist()


def result_to_json(result: Result) -> dict[str, Any]:
    """A result as JSON: the shape the CLI's ``--json``, the gateway and webhooks share."""
    return {
        "request_id": result.request_id,
        "status": result.status,
        "outputs": tensors_to_json(result.outputs),
        "error": None if result.error is None else result.error.to_wire(),
        "model": result.model,
        "model_version": result.model_version,
        "attempts": result.attempts,
        "enqueued_at": result.enqueued_at,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "queue_ms": result.queue_ms,
        "compute_ms": result.compute_ms,
        "batch_size": result.batch_size,
        "generation": result.generation,
    }
