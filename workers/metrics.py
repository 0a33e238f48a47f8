"""Prometheus metrics of one worker, labelled by model and lane where that means something.

A registry per worker (not the global one) keeps tests and several workers in
one process apart. The worker calls the ``on_*`` hooks; :meth:`sample` fills the
gauges that need a look at the outside world (backlog, DLQ size), every few
seconds from the worker's sampler task. Every name is listed in docs/operations.md.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from math import isnan
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batchfleet.connectors.broker import LaneBacklog
from batchfleet.workers.breaker import BreakerState, CircuitBreaker
from batchfleet.workers.completion import Completed

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                    60, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_DIFF_BUCKETS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0)
#: Weight of the newest throughput sample in the moving average behind time-to-drain.
_EWMA_ALPHA = 0.3
#: Per-model counters in the heartbeat's ``model_stats`` (with ``rps``); terminal statuses
#: count first writes only, as ``batchfleet_requests`` does.
MODEL_COUNTERS = ("batches", "rows", "succeeded", "failed", "expired", "cancelled")
#: How many recent latencies per lane the p99 is computed over.
_RECENT = 2048


class BreakerView(Protocol):
    """A breaker as the gauges read it (a ``CircuitBreaker``, or all of a worker's model
    breakers read as one)."""

    @property
    def name(self) -> str: ...

    @property
    def state(self) -> BreakerState: ...

    @property
    def trips(self) -> int: ...


class ResidencyMetrics:
    """Loading on demand (docs/models.md, "Loading on demand"): cold starts by phase, loads,
    evictions and what is loaded. ``batchfleet_model_load_seconds`` keeps its meaning (the
    last set-up plus warm-up), set on every load too."""

    def __init__(self, r: CollectorRegistry, model_load: Gauge) -> None:
        self.model_load = model_load
        # Loading on demand (docs/models.md, "Loading on demand")
        self.cold_start = Histogram("batchfleet_model_cold_start_seconds", "Loading a model "
                                    "version on demand: phase load (build and set-up) or "
                                    "warmup (its warm-up batches)",
                                    ["model", "version", "phase"], buckets=_LATENCY_BUCKETS,
                                    registry=r)
        self.model_loads = Counter("batchfleet_model_loads", "Model versions loaded on "
                                   "demand", ["model", "version"], registry=r)
        self.model_evictions = Counter("batchfleet_model_evictions", "Model versions "
                                       "evicted to make room", ["model", "version"],
                                       registry=r)
        self.model_loaded = Gauge("batchfleet_model_loaded", "1 while a model version is "
                                  "loaded (held in memory and read)", ["model", "version"],
                                  registry=r)

    def on_model_loaded(self, model: str, version: str, load_s: float,
                        warmup_s: float) -> None:
        self.cold_start.labels(model, version, "load").observe(load_s)
        self.cold_start.labels(model, version, "warmup").observe(warmup_s)
        self.model_loads.labels(model, version).inc()
        self.model_loaded.labels(model, version).set(1)
        self.model_load.labels(model).set(load_s + warmup_s)

    def on_model_evicted(self, model: str, version: str) -> None:
        self.model_evictions.labels(model, version).inc()
        self.model_loaded.labels(model, version).set(0)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("batchfleet_requests", "Requests that reached a terminal status "
                                "(first write only)", ["model", "lane", "status"], registry=r)
        self.duplicates = Counter("batchfleet_duplicate_results", "Terminal writes refused "
                                  "because the request already had a result", ["model"],
                                  registry=r)
        self.batch_size = Histogram("batchfleet_batch_size", "Requests per computed batch",
                                    ["model", "lane"], buckets=_BATCH_BUCKETS, registry=r)
        self.queue_wait = Histogram("batchfleet_queue_wait_seconds", "Submit to compute start",
                                    ["model", "lane"], buckets=_LATENCY_BUCKETS, registry=r)
        self.compute = Histogram("batchfleet_compute_seconds", "Compute time of one batch",
                                 ["model", "lane"], buckets=_LATENCY_BUCKETS, registry=r)
        self.end_to_end = Histogram("batchfleet_end_to_end_seconds",
                                    "Submit to result written", ["model", "lane"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.retries = Counter("batchfleet_retries", "Requests scheduled for another attempt",
                               ["model", "lane"], registry=r)
        self.dead_lettered = Counter("batchfleet_dead_lettered", "Requests sent to the DLQ",
                                     ["model", "lane"], registry=r)
        self.degraded = Counter("batchfleet_degraded", "Requests answered by a fallback step "
                                "(first write only; docs/degradation.md)",
                                ["model", "reason", "fallback"], registry=r)
        self.backlog = Gauge("batchfleet_backlog", "Requests queued on a lane, not yet acked "
                             "(Kafka: this worker's partitions' lag)", ["model", "lane"],
                             registry=r)
        self.oldest_age = Gauge("batchfleet_oldest_request_age_seconds",
                                "Age of the oldest unfinished request on a lane (Redis)",
                                ["model", "lane"], registry=r)
        self.time_to_drain = Gauge("batchfleet_time_to_drain_seconds", "Backlog divided by "
                                   "this worker's measured throughput", ["model", "lane"],
                                   registry=r)
        self.dlq_size = Gauge("batchfleet_dlq_size", "Entries in a model's dead-letter queue",
                              ["model"], registry=r)
        self.breaker_state = Gauge("batchfleet_breaker_state", "0 closed, 1 half-open, 2 open",
                                   ["breaker"], registry=r)
        self.breaker_trips = Gauge("batchfleet_breaker_trips", "Times a breaker has opened",
                                   ["breaker"], registry=r)
        self.model_breaker_state = Gauge("batchfleet_model_breaker_state", "A model's own "
                                         "breaker: 0 closed, 1 half-open, 2 open", ["model"],
                                         registry=r)
        self.model_breaker_trips = Gauge("batchfleet_model_breaker_trips", "Times a model's "
                                         "breaker has opened", ["model"], registry=r)
        self.lane_pauses = Counter("batchfleet_lane_pauses", "Times this worker stopped "
                                   "pulling a model's lanes (its breaker or the store's "
                                   "opened, or an operator paused them)", ["model"], registry=r)
        self.in_flight = Gauge("batchfleet_in_flight", "Requests fetched and not yet acked",
                               ["model"], registry=r)
        self.model_load = Gauge("batchfleet_model_load_seconds", "Set-up plus warm-up time",
                                ["model"], registry=r)
        self.residency = ResidencyMetrics(r, self.model_load)
        # what each version answers (docs/monitoring.md)
        self.output_drift, self.output_nan_ratio = (
            Gauge("batchfleet_output_drift", "A version's fleet-merged output drift against "
                  "its reference (stat: psi, ks, nan_rate_change, class_share_change, and "
                  "input_ for its inputs; docs/monitoring.md)", ["model", "version", "stat"],
                  registry=r),
            Gauge("batchfleet_output_nan_ratio", "Share of a version's output values that "
                  "are NaN (fleet-merged)", ["model", "version"], registry=r))
        self.model_accuracy = Gauge("batchfleet_model_accuracy_diff", "A non-eager runtime's "
                                    "difference from eager fp32 on the calibration rows "
                                    "(stat: max_abs, mean_abs, relative)", ["model", "stat"],
                                    registry=r)
        self.device_memory = Gauge("batchfleet_device_memory_bytes", "CUDA memory allocated "
                                   "(only on CUDA)", ["device"], registry=r)
        self.batch_close_wait = Gauge("batchfleet_batch_close_wait_ms", "With "
                                      "--latency-slo-ms: how long a request arriving now "
                                      "would wait for its batch to close", ["model"],
                                      registry=r)
        self.up = Gauge("batchfleet_worker_up", "1 while the worker is consuming", ["model"],
                        registry=r)
        self._rollout_and_cache(r)
        self._pipelines(r)
        self._done_since = 0
        self._last_sample = time.monotonic()
        self._rate = 0.0
        #: Recent end-to-end latencies per (model, lane), for the p99 in the heartbeat; and
        #: recent queue waits (per request) and compute times (per batch), for the console.
        self._recent: dict[tuple[str, str], deque[float]] = {}
        self._recent_queue: dict[tuple[str, str], deque[float]] = {}
        self._recent_compute: dict[tuple[str, str], deque[float]] = {}
        #: The last sample, per "model/lane", as ``batchfleet status`` shows it.
        self.lanes: dict[str, dict[str, float | None]] = {}
        self.throughput_rps = 0.0
        self._pauses: dict[str, int] = {}
        #: Per model: terminal writes since the last sample, the rate's moving average,
        #: and counters since start (the heartbeat's ``model_stats``; status reads them).
        self._model_done: dict[str, int] = {}
        self._model_rate: dict[str, float] = {}
        self._model_counts: dict[str, dict[str, int]] = {}
        #: Degraded answers written per model, for the models with a fallback chain only
        #: (``watch_degraded``): a model without one reports no count, so ``status`` shows
        #: "—" for it rather than a 0% that would read as "a chain that never answered".
        self._model_degraded: dict[str, int] = {}


    def _pipelines(self, r: CollectorRegistry) -> None:
        """Pipeline families (docs/pipelines.md), labelled by pipeline and step; the
        per-model families keep their labels, so a step also counts under its model."""
        self.pipeline_steps = Counter("batchfleet_pipeline_steps", "Pipeline steps whose "
                                      "terminal result this worker wrote first, handed on",
                                      ["pipeline", "step", "status"], registry=r)
        self.pipeline_results = Counter("batchfleet_pipeline_results", "Pipeline results "
                                        "this worker wrote for the caller (last step, or "
                                        "the failure)", ["pipeline", "status"], registry=r)

    def _rollout_and_cache(self, r: CollectorRegistry) -> None:
        """The rollout and result-cache families (apart: one constructor would be too long)."""
        # Rollout (docs/rollout.md): per version label and role (stable, canary, shadow,
        # pinned), shadow comparisons, and the guard's automatic rollbacks.
        self.version_requests = Counter("batchfleet_version_requests", "Requests computed "
                                        "by a version (outcome: ok, error)",
                                        ["model", "version", "role", "outcome"], registry=r)
        self.version_compute = Histogram("batchfleet_version_compute_seconds", "Compute "
                                         "time of one batch of a version",
                                         ["model", "version", "role"],
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.shadow_requests = Counter("batchfleet_shadow_requests", "Stable requests "
                                       "offered to the shadow version (outcome: compared, "
                                       "skipped, error)", ["model", "outcome"], registry=r)
        self.shadow_diff = Histogram("batchfleet_shadow_abs_diff", "Largest absolute "
                                     "difference between a request's shadow and stable "
                                     "outputs", ["model"], buckets=_DIFF_BUCKETS, registry=r)
        self.shadow_skipped = Counter("batchfleet_shadow_batches_skipped", "Stable batches "
                                      "not shadowed (reason: budget, busy, backlog, absent, "
                                      "stopping, overflow, stalled)", ["model", "reason"],
                                      registry=r)
        self.beside_shadow = Counter("batchfleet_stable_batches_beside_shadow", "Batches "
                                     "handed to compute while a shadow forward ran",
                                     ["model"], registry=r)
        self.delayed_by_shadow = Counter("batchfleet_stable_batches_delayed_by_shadow",
                                         "Batches handed to compute while a shadow forward "
                                         "ran that were queued behind it on its thread", ["model"],
                                         registry=r)
        self.auto_rollbacks = Counter("batchfleet_rollout_auto_rollbacks", "Canaries the "
                                      "guard rolled back (counted by the worker that did it)",
                                      ["model"], registry=r)
        # Result cache (docs/cache.md): hit ratio = (hits + coalesced) / (the three summed).
        self.cache_hits = Counter("batchfleet_cache_hits", "Requests answered from the result "
                                  "cache", ["model"], registry=r)
        self.cache_coalesced = Counter("batchfleet_cache_coalesced", "Requests answered by an "
                                       "identical request computed in the same batch",
                                       ["model"], registry=r)
        self.cache_misses = Counter("batchfleet_cache_misses", "Cache-enabled requests that "
                                    "were computed", ["model"], registry=r)
        self.cache_saved = Counter("batchfleet_cache_saved_compute_seconds", "Compute time "
                                   "hits and coalesced requests did not spend (per-row time "
                                   "of the batch that computed them)", ["model"], registry=r)
        self.cache_errors = Counter("batchfleet_cache_errors", "Result-cache reads or writes "
                                    "that failed (read as misses)", ["model"], registry=r)

    def on_batch(self, model: str, lane: str, size: int, compute_s: float) -> None:
        self.batch_size.labels(model, lane).observe(size)
        self.compute.labels(model, lane).observe(compute_s)
        counts = self._counts(model)
        counts["batches"] += 1
        counts["rows"] += size
        _recent(self._recent_compute, (model, lane)).append(compute_s)

    def _counts(self, model: str) -> dict[str, int]:
        counts = self._model_counts.get(model)
        if counts is None:
            counts = self._model_counts[model] = dict.fromkeys(MODEL_COUNTERS, 0)
        return counts

    def model_stats(self) -> dict[str, dict[str, float]]:
        """Per model: its own req/s (moving average, as ``throughput_rps``) and its counters
        since start: batches and rows computed, terminal writes by status, and ``degraded``
        (of ``succeeded``) for a model with a fallback chain."""
        degraded = self._model_degraded
        return {model: {"rps": round(self._model_rate.get(model, 0.0), 2), **counts,
                        **({"degraded": degraded[model]} if model in degraded else {})}
                for model, counts in sorted(self._model_counts.items())}

    def watch_degraded(self, models: Iterable[str]) -> None:
        """Report a ``degraded`` count (from 0) in these models' ``model_stats``."""
        for model in models:
            self._model_degraded.setdefault(model, 0)

    def on_degraded(self, model: str, reason: str, fallback: str | None) -> None:
        """One degraded answer written (first write only)."""
        self.degraded.labels(model, reason, fallback).inc()
        self._model_degraded[model] = self._model_degraded.get(model, 0) + 1

    def on_lanes_paused(self, models: Iterable[str]) -> None:
        for model in models:
            self.lane_pauses.labels(model).inc()
            self._pauses[model] = self._pauses.get(model, 0) + 1

    def lane_pause_counts(self) -> dict[str, int]:
        """Lane pauses per model so far (for the heartbeat and tests)."""
        return dict(self._pauses)

    def on_completed(self, done: Completed, now: float) -> None:
        """Count a written batch: one labelled update per (model, lane, status), not per
        request, since resolving labels dominated this at small per-request costs."""
        self.retries_and_dlq(done)
        counts: dict[tuple[str, str, str], int] = {}
        latencies: dict[tuple[str, str], list[float]] = {}
        queue_waits: dict[tuple[str, str], list[float]] = {}
        duplicates: dict[str, int] = {}
        for answer, first in zip(done.answers, done.won, strict=True):
            res, lane = answer.result, answer.delivery.lane
            if not first:
                duplicates[res.model] = duplicates.get(res.model, 0) + 1
                continue
            key = (res.model, lane, res.status)
            counts[key] = counts.get(key, 0) + 1
            if res.enqueued_at:
                latencies.setdefault((res.model, lane), []).append(max(0.0, now - res.enqueued_at))
            if res.queue_ms is not None and res.status == "succeeded":
                queue_waits.setdefault((res.model, lane), []).append(res.queue_ms / 1000.0)
        for model, n in duplicates.items():
            self.duplicates.labels(model).inc(n)
        for status_key, n in counts.items():
            self.requests.labels(*status_key).inc(n)
            self._done_since += n
            model, _, status = status_key
            self._model_done[model] = self._model_done.get(model, 0) + n
            per_model = self._counts(model)
            per_model[status] = per_model.get(status, 0) + n
        for lane_key, values in latencies.items():
            _observe_all(self.end_to_end.labels(*lane_key), values)
            _recent(self._recent, lane_key).extend(values)
        for lane_key, values in queue_waits.items():
            _observe_all(self.queue_wait.labels(*lane_key), values)
            _recent(self._recent_queue, lane_key).extend(values)

    def retries_and_dlq(self, done: Completed) -> None:
        for delivery in done.rescheduled:
            self.retries.labels(delivery.model, delivery.lane).inc()
        for model, lane in done.dead_lettered:
            self.dead_lettered.labels(model, lane).inc()

    def sample(self, backlog: Sequence[LaneBacklog], dlq_sizes: dict[str, int],
               breakers: Iterable[BreakerView], in_flight: dict[str, int],
               model_breakers: Mapping[str, CircuitBreaker] | None = None) -> None:
        now = time.monotonic()
        elapsed = max(1e-6, now - self._last_sample)
        rate = self._done_since / elapsed
        self._rate = _ewma(self._rate, rate)
        self._done_since, self._last_sample = 0, now
        for model in {*self._model_done, *self._model_rate}:
            self._model_rate[model] = _ewma(self._model_rate.get(model, 0.0),
                                            self._model_done.get(model, 0) / elapsed)
        self._model_done = {}
        for lane in backlog:
            self.backlog.labels(lane.model, lane.lane).set(lane.depth)
            if lane.oldest_age_s is not None:
                self.oldest_age.labels(lane.model, lane.lane).set(lane.oldest_age_s)
            drain = lane.depth / self._rate if self._rate > 0 else (
                0.0 if not lane.depth else float("inf"))
            self.time_to_drain.labels(lane.model, lane.lane).set(drain)
            key = (lane.model, lane.lane)
            self.lanes[f"{lane.model}/{lane.lane}"] = {
                "backlog": lane.depth, "oldest_age_s": lane.oldest_age_s,
                "time_to_drain_s": drain if drain != float("inf") else None,
                **_percentiles("", self._recent.get(key), (50, 95, 99)),
                **_percentiles("queue_", self._recent_queue.get(key), (50, 99)),
                **_percentiles("compute_", self._recent_compute.get(key), (50, 99)),
            }
        self.throughput_rps = self._rate
        for model, size in dlq_sizes.items():
            self.dlq_size.labels(model).set(size)
        for breaker in breakers:
            self.breaker_state.labels(breaker.name).set(breaker.state.code)
            self.breaker_trips.labels(breaker.name).set(breaker.trips)
        for model, breaker in (model_breakers or {}).items():
            self.model_breaker_state.labels(model).set(breaker.state.code)
            self.model_breaker_trips.labels(model).set(breaker.trips)
        for model, count in in_flight.items():
            self.in_flight.labels(model).set(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _recent(recent: dict[tuple[str, str], deque[float]], key: tuple[str, str]
            ) -> deque[float]:
    found = recent.get(key)
    if found is None:
        found = recent[key] = deque(maxlen=_RECENT)
    return found


def _percentiles(prefix: str, values: deque[float] | None, which: tuple[int, ...]
                 ) -> dict[str, float | None]:
    """``{prefix}p50_ms`` ...: percentiles of recent seconds, in ms (None: none yet)."""
    if not values:
        return {f"{prefix}p{q}_ms": None for q in which}
    found = np.percentile(values, which) * 1000.0
    return {f"{prefix}p{q}_ms": float(v) for q, v in zip(which, found, strict=True)}


def _ewma(average: float, sample: float) -> float:
    """The moving average behind the rates; the first sample is taken whole."""
    return sample if average == 0 else _EWMA_ALPHA * sample + (1 - _EWMA_ALPHA) * average


def _observe_all(child: Histogram, values: list[float]) -> None:
    """``child.observe(v)`` for each value, counted per bucket and added once per bucket.

    ``Histogram.observe`` scans the buckets and takes two locks per value (1.5 us; two
    histograms per request made it a tenth of the worker's CPU outside a small model).
    This reaches into the child's ``_upper_bounds``, ``_buckets`` and ``_sum``, unchanged
    in prometheus-client for years, and observes one by one where they are not there.
    A NaN lands in no bucket and makes the sum NaN, as ``observe`` does.
    """
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            child.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        if not isnan(value):  # NaN: no bucket
            at = bisect_left(bounds, value)  # the first bound >= value, as observe's scan
            counts[at] = counts.get(at, 0) + 1
    total.inc(sum(values))
    for at, n in counts.items():
        if at < len(buckets):
            buckets[at].inc(n)
