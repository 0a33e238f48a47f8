"""One model's figures across the workers serving it: its own req/s, mean batch size,
error and degraded rates. Pure: the fleet reader (``connectors.fleet``) feeds it the
per-model stats each heartbeat carries (``HeartbeatRecord.model_stats``).

A worker serving several models reports each model's own rate; an older worker that
reports none has only its whole rate, which then stands for each of its models (the
figure ``status`` showed before). Batch size and the rates are over the counters since
each worker started, so they match ``batchfleet_batch_size`` and ``batchfleet_requests``
summed over the same workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Terminal statuses a model's error rate is taken over (a cancel is no one's error).
_DONE = ("succeeded", "failed", "expired")
#: Per-model figures that are settings or rates, not counters to add up.
_NOT_COUNTED = frozenset({"rps", "max_batch_size"})


@dataclass(frozen=True, slots=True)
class ModelFigures:
    throughput_rps: float
    #: Rows per computed batch; None before any batch.
    mean_batch_size: float | None
    #: Failed of terminal writes (succeeded, failed, expired); None before any.
    error_rate: float | None
    #: Degraded answers (issue 26's fallback) of terminal writes; None while no worker
    #: reports a degraded count.
    degraded_rate: float | None
    #: Counters summed over the workers (batches, rows, succeeded, failed, ...).
    counts: dict[str, float]


def degraded_count(stats: Mapping[str, float]) -> float | None:
    """The one place the degraded count is read from a worker's per-model stats (the
    fallback's ``degraded`` counter); None where the worker does not report one."""
    value = stats.get("degraded")
    return None if value is None else float(value)


def model_figures(model: str, workers: Iterable[tuple[Mapping[str, Mapping[str, float]], float]]
                  ) -> ModelFigures:
    """``workers``: (per-model stats, whole req/s) of each worker serving ``model``."""
    rate = 0.0
    counts: dict[str, float] = {}
    degraded: float | None = None
    for per_model, whole_rps in workers:
        stats = per_model.get(model)
        if not per_model:  # an older worker: its whole rate, as before
            rate += whole_rps
            continue
        if stats is None:
            continue
        rate += stats.get("rps", 0.0)
        for name, value in stats.items():
            if name not in _NOT_COUNTED:
                counts[name] = counts.get(name, 0.0) + value
        if (found := degraded_count(stats)) is not None:
            degraded = (degraded or 0.0) + found
    done = sum(counts.get(s, 0.0) for s in _DONE)
    batches = counts.get("batches", 0.0)
    return ModelFigures(
        throughput_rps=round(rate, 2),
        mean_batch_size=round(counts.get("rows", 0.0) / batches, 2) if batches else None,
        error_rate=round(counts.get("failed", 0.0) / done, 4) if done else None,
        degraded_rate=None if degraded is None else (round(degraded / done, 4) if done else 0.0),
        counts=counts)
