"""What tracing costs a request when the ``OTEL_*`` variables leave it off.

Off, the worker installs no tracing middleware at all (workers/middleware/defaults.py
adds the layer only when ``connectors.tracing.tracer`` returns one), so its cost
there is nothing. The SDK keeps one check per request (``if self._tracer is not
None``); that check is timed here on the very attribute the client holds. The
bench's own environment decides: with ``OTEL_*`` set the row says so and is not
a measurement of "off".
"""

from __future__ import annotations

import os
import timeit
from types import SimpleNamespace
from typing import Any

from batchfleet.connectors.tracing import enabled_by
from batchfleet.connectors.tracing import tracer as otel_tracer

_CALLS = 1_000_000


def tracing_unset_cost() -> dict[str, Any]:
    """µs per request that tracing adds with ``OTEL_*`` unset: worker and client."""
    if enabled_by(os.environ):
        return {"skipped": "OTEL_* variables turn tracing on in the bench's environment"}
    client = SimpleNamespace(_tracer=otel_tracer("batchfleet"))
    worker_layer = otel_tracer("batchfleet-worker") is not None
    stmt = "if client._tracer is not None:\n    pass"
    best = min(timeit.repeat(stmt, globals={"client": client}, number=_CALLS, repeat=5))
    client_us = best / _CALLS * 1e6
    return {"worker_tracing_layer": worker_layer, "worker_us_per_request": 0.0,
            "client_us_per_request": round(client_us, 4),
            "us_per_request": round(client_us, 4)}
