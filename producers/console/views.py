"""What the console shows, shaped from the readers' values: pure functions, tested directly.

Rows come from the fleet snapshot ``batchfleet status`` reads (``connectors.fleet``), so a
figure on the page is the figure in ``status --json``; :class:`History` keeps the last hour
of them for the sparklines, in this process (a console started a minute ago has a minute).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from batchfleet.connectors.fleet import FleetSnapshot, WorkerView
from batchfleet.connectors.values import DeadLetter
from batchfleet.schemas.heartbeat import LIVE_WITHIN_S

#: Sparkline figures, per model.
SERIES = ("rps", "depth", "p99_ms", "error_rate")
#: Latency figures each worker reports per lane (ms): end to end, queue wait, compute.
LATENCIES = ("p50_ms", "p95_ms", "p99_ms", "queue_p50_ms", "queue_p99_ms",
             "compute_p50_ms", "compute_p99_ms")


def _iso(ts: float | None) -> str | None:
    return None if not ts else datetime.fromtimestamp(ts, UTC).isoformat()


def model_rows(snap: FleetSnapshot) -> list[dict[str, Any]]:
    """One row per model: its lanes added up (depth, lag, the oldest age, the worst p99)
    and the model-wide figures every lane row of the snapshot repeats."""
    rows: dict[str, dict[str, Any]] = {}
    for lane in snap.lanes:
        row = rows.get(lane.model)
        if row is None:
            row = rows[lane.model] = {
                "model": lane.model, "depth": 0, "lag": 0, "oldest_age_s": None,
                "p99_ms": None, "rps": lane.throughput_rps,
                "mean_batch_size": lane.mean_batch_size, "error_rate": lane.error_rate,
                "degraded_rate": lane.degraded_rate, "workers": lane.workers, "dlq": lane.dlq,
                "breakers": lane.breakers, "lanes": {}}
        row["depth"] += lane.depth or 0
        row["lag"] += lane.lag or 0
        row["oldest_age_s"] = _worst(row["oldest_age_s"], lane.oldest_age_s)
        row["p99_ms"] = _worst(row["p99_ms"], lane.p99_ms)
        row["lanes"][lane.lane] = {"depth": lane.depth, "lag": lane.lag,
                                   "oldest_age_s": lane.oldest_age_s, "p99_ms": lane.p99_ms}
    for row in rows.values():
        serving = [w for w in snap.workers if row["model"] in w.models]
        row["latency_ms"] = _latencies(row["model"], serving)
        caps = [s["max_batch_size"] for w in serving
                if (s := w.model_stats.get(row["model"])) and s.get("max_batch_size")]
        mean = row["mean_batch_size"]
        row["batch_fill"] = round(mean / max(caps), 4) if caps and mean else None
        hits = looked = 0
        for w in snap.workers:
            if row["model"] in w.models and len(w.models) == 1:
                c = w.counters
                hits += c.get("cache_hits", 0) + c.get("cache_coalesced", 0)
                looked += c.get("cache_hits", 0) + c.get("cache_coalesced", 0) + \
                    c.get("cache_misses", 0)
        row["cache_hit_ratio"] = round(hits / looked, 4) if looked else None
    return [rows[m] for m in sorted(rows)]


def _latencies(model: str, workers: Sequence[WorkerView]) -> dict[str, float | None]:
    """Each latency figure, the worst any worker reports on any lane of the model
    (percentiles do not add up; the worst is the one to look at)."""
    out: dict[str, float | None] = dict.fromkeys(LATENCIES)
    for w in workers:
        for key, figures in w.lanes.items():
            if key.partition("/")[0] == model:
                for name in LATENCIES:
                    out[name] = _worst(out[name], figures.get(name))
    return {k: None if v is None else round(v, 2) for k, v in out.items()}


def _worst(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def worker_rows(snap: FleetSnapshot) -> list[dict[str, Any]]:
    """Live workers; ``stale`` when the last beat is older than two missed beats."""
    return [{"worker_id": w.worker_id, "host": w.host, "device": w.device,
             "models": list(w.models), "up_s": w.up_s, "seen_s_ago": w.seen_s_ago,
             "stale": w.seen_s_ago is not None and w.seen_s_ago > LIVE_WITHIN_S,
             "breakers": w.breakers, "rps": w.throughput_rps, "buffered": w.buffered,
             "counters": w.counters, "model_stats": w.model_stats,
             "loaded": None if w.loaded is None else list(w.loaded)} for w in snap.workers]


def letter_json(dl: DeadLetter) -> dict[str, Any]:
    errors = [{**e, "at": _iso(e["at"])} if isinstance(e.get("at"), int | float) else e
              for e in dl.errors]
    return {"request_id": dl.request_id, "model": dl.model, "attempts": dl.attempts,
            "reason": dl.reason, "error_type": dl.last_error_type,
            "dead_at": _iso(dl.dead_at), "entry_id": dl.entry_id, "errors": errors}


def error_types(letters: Iterable[DeadLetter]) -> dict[str, int]:
    """Letters per last error type (over the letters given: the newest page)."""
    counts: dict[str, int] = {}
    for dl in letters:
        counts[dl.last_error_type or "?"] = counts.get(dl.last_error_type or "?", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def rollout_json(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """A model's ``rollout status --json`` document cut to what the page shows: the policy,
    each version's role and stats, the guard, the last decisions with their reasons; None
    for a model that never had a rollout (no policy change recorded)."""
    history: Sequence[Mapping[str, Any]] = status.get("history") or []
    if not history:
        return None
    policy = status.get("policy") or {}
    return {"model": status.get("model"), "policy": policy,
            "guard": policy.get("guard"), "versions": status.get("versions"),
            "converged": status.get("converged"), "decisions": list(history)[:5]}


class History:
    """Per-model figures every ``every_s`` for the last ``span_s``: the sparklines. The error
    share here is over each interval (deltas of the counters), not since start."""

    def __init__(self, every_s: float = 10.0, span_s: float = 3600.0) -> None:
        self.every_s = every_s
        self._samples: deque[tuple[float, dict[str, dict[str, float | None]]]] = deque(
            maxlen=max(2, int(span_s / every_s)))
        self._last_counts: dict[str, tuple[float, float]] = {}
        #: The newest figures, shown after the kept samples until the next one is kept.
        self._live: tuple[float, dict[str, dict[str, float | None]]] | None = None

    def add(self, now: float, models: Sequence[Mapping[str, Any]],
            counts: Mapping[str, tuple[float, float]]) -> None:
        """``counts``: per model, (terminal writes, failed) summed over the live workers."""
        keep = not self._samples or now - self._samples[-1][0] >= self.every_s
        sample: dict[str, dict[str, float | None]] = {}
        for row in models:
            model = row["model"]
            done, failed = counts.get(model, (0.0, 0.0))
            before = self._last_counts.get(model)
            share = None
            if before is not None and done - before[0] > 0 and failed >= before[1]:
                share = round((failed - before[1]) / (done - before[0]), 4)
            sample[model] = {"rps": row["rps"], "depth": row["depth"],
                             "p99_ms": row["p99_ms"], "error_rate": share}
            if keep:
                self._last_counts[model] = (done, failed)
        if keep:
            self._samples.append((now, sample))
            self._live = None
        else:
            self._live = (now, sample)

    def series(self) -> dict[str, Any]:
        """``{"t": [...], "models": {model: {figure: [...]}}}``, aligned on ``t``: the kept
        samples, then the newest figures if newer."""
        samples = [*self._samples, *([self._live] if self._live else [])]
        models = sorted({m for _, sample in samples for m in sample})
        return {"t": [t for t, _ in samples],
                "models": {m: {f: [s.get(m, {}).get(f) for _, s in samples]
                               for f in SERIES} for m in models}}
