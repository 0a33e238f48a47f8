"""What the fleet sees of a worker: ``/readyz`` (whether it should take traffic, and why
not), its vitals (heartbeat, final log line) and its in-flight counts (metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchfleet.connectors.cancelling import bounded
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.aio import within

if TYPE_CHECKING:
    from batchfleet.workers.worker import Worker


async def readiness(worker: Worker) -> tuple[bool, dict[str, Any]]:
    """Ready: warmed up and not stopping, broker and store answering, and every middleware
    agreeing (no breaker open, no compute thread stuck)."""
    checks = {"warmed_up": worker.ready.is_set() and not worker.stopping.is_set(),
              "result_store": await within(worker.store.ping(), 1.0),
              "broker": worker.fetch_failures == 0, **worker.hooks.readiness()}
    # Reported, not gated on: an allkeys-* policy can evict a stream (the queue itself),
    # which operators must fix in Redis; taking workers out of service would not help.
    redis: dict[str, Any] = {}
    try:
        pressure = await bounded(worker.store.pressure(), 1.0)
        redis = {"eviction_policy": pressure.eviction_policy,
                 "eviction_policy_safe": pressure.eviction_safe}
    except (BatchfleetError, TimeoutError):
        pass
    vitals = worker.hooks.vitals()
    breakers: dict[str, Any] = {k: vitals[k] for k in (
        "breakers", "model_breakers", "stuck_compute", "compute_limits_s") if k in vitals}
    return all(checks.values()), {"checks": checks, **breakers, **redis}


def in_flight(worker: Worker) -> dict[str, int]:
    """Requests fetched and not yet acked, per model: batched, computing, held."""
    counts = dict.fromkeys(worker.handlers, 0)
    for key, n in worker.batcher.sizes().items():
        counts[key.model] += n
    slot, computing = worker.compute.computing
    if slot:
        counts[slot.partition("@")[0]] += computing
    for model, held in worker.hooks.held().items():
        counts[model] += held
    return counts


def vitals(worker: Worker) -> dict[str, Any]:
    """What the heartbeat and the final log line report."""
    s = worker.settings
    return {"worker_id": s.worker_id, "models": list(worker.handlers),
            "device": str(worker.compute.device), "broker": s.broker.kind,
            "buffered": len(worker.batcher), **worker.hooks.vitals()}
