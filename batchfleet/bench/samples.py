"""Per-request measurements and the summaries the report is built from.

A sample is taken at the client when a result becomes available there, so
``done - sent`` is the latency a caller sees. The worker's own timings
(``queue_ms``, ``compute_ms``, ``batch_size``) ride along on the result and
give the split between waiting in the queue and computing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchfleet.producers.stage_stamps import StageStamps
from batchfleet.schemas.envelopes import Result


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: when it was sent and answered (wall clock), and what the worker reported.

    ``sent`` is the caller's clock (the scheduled arrival in the open loop), ``done``
    when the result reached the caller; ``enqueued_at`` and ``finished_at`` are the
    Result's own stamps (SDK enqueue, worker's terminal write), so two latencies exist:
    caller-side (``latency_ms``) and fleet-side (``fleet_ms``).
    """

    sent: float
    done: float
    status: str
    queue_ms: float
    compute_ms: float
    batch_size: int
    enqueued_at: float = 0.0
    finished_at: float = 0.0
    #: When the result's announcement reached the client and when it was handed to its
    #: waiter (``producers.stage_stamps``); 0.0 for a result read back, not announced.
    received_at: float = 0.0
    delivered_at: float = 0.0

    @property
    def latency_ms(self) -> float:
        return (self.done - self.sent) * 1000.0

    @property
    def fleet_ms(self) -> float:
        """Enqueue to ``finished_at``: the fleet's share, without the caller's own delays."""
        if not self.enqueued_at or not self.finished_at:
            return math.nan
        return (self.finished_at - self.enqueued_at) * 1000.0

    def as_row(self) -> Row:
        """A plain tuple: cheap to pickle back from a producer process."""
        return (self.sent, self.done, self.status, self.queue_ms, self.compute_ms,
                self.batch_size, self.enqueued_at, self.finished_at, self.received_at,
                self.delivered_at)


#: A sample as a plain tuple (``Sample.as_row``'s fields). The load generators keep rows,
#: not ``Sample`` objects, while a phase runs: CPython's collector stops tracking a tuple
#: of numbers and strings, so 100,000 rows add nothing to the full collections a
#: producer makes, where 100,000 dataclass instances made each one walk them all
#: (docs/performance.md, "Garbage collection").
Row = tuple[float, float, str, float, float, int, float, float, float, float]


def row_of(result: Result, sent: float, done: float,
           stages: StageStamps | None = None) -> Row:
    stamps = stages.pop(result.request_id) if stages is not None else None
    received, delivered = stamps or (0.0, 0.0)
    return (sent, done, result.status, result.queue_ms or 0.0, result.compute_ms or 0.0,
            result.batch_size or 0, result.enqueued_at or 0.0, result.finished_at or 0.0,
            received, delivered)


def sample_of(result: Result, sent: float, done: float,
              stages: StageStamps | None = None) -> Sample:
    return Sample(*row_of(result, sent, done, stages))


#: The stages between the worker's terminal write and the caller (``client_stages``).
STAGES = ("announce_ms", "deliver_ms", "wake_ms")


def client_stages(samples: Sequence[Sample]) -> dict[str, Any]:
    """Where a result's time goes after the worker's ``finished_at``, p50/p99 per stage.

    ``announce_ms``: ``finished_at`` to the client's listener receiving the announcement
    (the terminal write, Redis pub/sub, the client's socket read and its loop getting to
    the listener); ``deliver_ms``: decoding the announcement's bodies and handing them to
    their waiters; ``wake_ms``: from there to the caller's task taking the result (its
    scheduling on the client's loop). ``announced_frac``: the share of results stamped so
    (the rest have no stages: read back by the safety poll, or announced before their
    caller began to wait, and kept for it).
    """
    stamped = [s for s in samples if s.received_at and s.finished_at]
    out: dict[str, Any] = {"announced_frac": _r(len(stamped) / len(samples)) if samples
                           else 0.0}
    columns = {
        "announce_ms": [(s.received_at - s.finished_at) * 1000.0 for s in stamped],
        "deliver_ms": [(s.delivered_at - s.received_at) * 1000.0 for s in stamped],
        "wake_ms": [(s.done - s.delivered_at) * 1000.0 for s in stamped],
    }
    for name, values in columns.items():
        if values:
            p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 99])
            out[name] = {"p50": _r(float(p50)), "p99": _r(float(p99))}
    return out


def in_window(samples: Sequence[Sample], start: float, end: float) -> list[Sample]:
    """The samples answered inside ``[start, end]``: steady state, without ramp-up or drain."""
    return [s for s in samples if start <= s.done <= end]


def _r(value: float, digits: int = 3) -> float:
    return round(value, digits) if math.isfinite(value) else value


def latency_summary(samples: Sequence[Sample], fleet: bool = False) -> dict[str, float]:
    """p50/p95/p99/max/mean in ms: caller-side (submit or scheduled arrival to result
    available at the caller), or with ``fleet`` the Result's enqueued_at to finished_at."""
    values = [s.fleet_ms if fleet else s.latency_ms for s in samples]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        nan = float("nan")
        return {"p50_ms": nan, "p95_ms": nan, "p99_ms": nan, "max_ms": nan, "mean_ms": nan}
    lat = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return {"p50_ms": _r(float(p50)), "p95_ms": _r(float(p95)), "p99_ms": _r(float(p99)),
            "max_ms": _r(float(lat.max())), "mean_ms": _r(float(lat.mean()))}


def time_split(samples: Sequence[Sample]) -> dict[str, float]:
    """Where a request's time goes, on average: queue wait, compute, and the rest.

    ``rest`` is submit, result write, announcement and the client's read: the
    transport's share. Fractions are of the mean end-to-end latency.
    """
    if not samples:
        return {}
    e2e = float(np.mean([s.latency_ms for s in samples]))
    queue = float(np.mean([s.queue_ms for s in samples]))
    compute = float(np.mean([s.compute_ms for s in samples]))
    rest = e2e - queue - compute
    return {"mean_e2e_ms": _r(e2e), "mean_queue_ms": _r(queue),
            "mean_compute_ms": _r(compute), "mean_rest_ms": _r(rest),
            "queue_frac": _r(queue / e2e if e2e else 0.0),
            "compute_frac": _r(compute / e2e if e2e else 0.0),
            "rest_frac": _r(rest / e2e if e2e else 0.0)}


@dataclass(frozen=True, slots=True)
class BatchTotals:
    """Batches behind a set of samples, reconstructed from each request's share of its batch.

    Each request carries its batch's size and compute time, so summing
    ``1 / batch_size`` counts batches and ``compute_ms / batch_size`` sums their
    compute, without the worker having to export anything else.
    """

    requests: int
    batches: float
    compute_s: float
    mean_batch_size: float

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "batches": round(self.batches, 1),
                "model_compute_s": round(self.compute_s, 4),
                "mean_batch_size": round(self.mean_batch_size, 2)}


def batch_totals(samples: Sequence[Sample]) -> BatchTotals:
    sized = [s for s in samples if s.batch_size > 0]
    batches = sum(1.0 / s.batch_size for s in sized)
    compute_s = sum(s.compute_ms / s.batch_size for s in sized) / 1000.0
    return BatchTotals(len(samples), batches, compute_s,
                       len(sized) / batches if batches else 0.0)
