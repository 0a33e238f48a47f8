"""Results as JSON: the one shape and the one encoder the CLI's ``--json``, the gateway's
``GET`` and webhook bodies share, so the bodies cannot drift apart.

Tensors become (nested) lists; everything else is the result envelope's fields.
JSON has no NaN or Infinity (``json.dumps`` would write them anyway, as invalid
JSON that strict parsers refuse), so every non-finite float becomes ``null``:
a model can turn finite inputs into NaN outputs, and that is a result to show,
not a body to break.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from batchfleet.schemas.envelopes import Result


def tensors_to_json(value: Any) -> Any:
    """Arrays (or named ones) as nested lists, with ``None`` for NaN and +-Infinity."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {k: tensors_to_json(v) for k, v in value.items()}
    array = np.asarray(value)
    if array.dtype.kind in "fc" and not np.isfinite(array).all():
        return _nulls_for_non_finite(array.tolist())
    return array.tolist()


def _nulls_for_non_finite(value: Any) -> Any:
    if isinstance(value, list):
        return [_nulls_for_non_finite(v) for v in value]
    return _finite(value)


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


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
        "enqueued_at": _finite(result.enqueued_at),
        "started_at": _finite(result.started_at),
        "finished_at": _finite(result.finished_at),
        "queue_ms": _finite(result.queue_ms),
        "compute_ms": _finite(result.compute_ms),
        "batch_size": result.batch_size,
        "generation": result.generation,
        "cached": result.cached,
        "degraded": result.degraded,
        "degraded_reason": result.degraded_reason,
        "fallback": result.fallback,
        "degraded_error": (None if result.degraded_error is None
                           else result.degraded_error.to_wire()),
        # a pipeline's result only (docs/pipelines.md): other results keep their shape
        **({} if result.steps is None else {"steps": [
            {k: _finite(v) for k, v in step.items()} for step in result.steps]}),
    }


def result_json_bytes(result: Result) -> bytes:
    """The body of ``GET /v1/requests/{id}`` and of a webhook: compact, strict JSON.

    ``allow_nan=False`` is the backstop: a non-finite float that slipped past
    :func:`result_to_json` raises here rather than going out as invalid JSON.
    """
    return json.dumps(result_to_json(result), separators=(",", ":"),
                      allow_nan=False).encode()


def finite(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, as ``None``: strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
