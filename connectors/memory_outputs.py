"""``memory://`` twin of ``connectors.output_stats``: windows kept in process memory,
merged by the same field arithmetic, trimmed after ``keep_s`` as the Redis keys expire."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from typing import Any

from batchfleet.connectors.memory_state import MemoryState
from batchfleet.connectors.output_stats import SIDES, Baseline, Flush, merge_windows
from batchfleet.connectors.output_summary import Summary, from_fields, to_fields

#: One model's windows: (label, side, start) -> [expires at, window end, fields].
_Windows = dict[tuple[str, str, int], list[Any]]


class MemoryOutputStats:
    """``RedisOutputStats`` in memory."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def _windows(self, model: str) -> _Windows:
        found: _Windows = self._state.setdefault(f"output-stats:{model}", dict)
        return found

    async def flush(self, model: str, flush: Flush) -> None:
        now = time.time()
        with self._state.lock:
            windows = self._windows(model)
            for (label, side), summary in flush.deltas.items():
                if summary.empty:
                    continue
                held = windows.setdefault((label, side, flush.start),
                                          [0.0, flush.start + flush.window_s, {}])
                held[0] = now + flush.keep_s
                fields: dict[str, Any] = held[2]
                ints, floats = to_fields(summary)
                for k, n in ints.items():
                    fields[k] = int(fields.get(k, 0)) + n
                for k, f in floats.items():
                    fields[k] = float(fields.get(k, 0.0)) + f
            for key in [k for k, w in windows.items() if w[0] <= now]:
                del windows[key]

    async def read(self, model: str, since: float, until: float | None = None,
                   labels: Collection[str] | None = None, side: str | None = None
                   ) -> dict[tuple[str, str], Summary]:
        now = time.time()
        with self._state.lock:
            rows = [(label, s, from_fields(w[2]))
                    for (label, s, _), w in self._windows(model).items()
                    if w[1] > since and w[0] > now and (until is None or w[1] <= until)
                    and (labels is None or label in labels) and (side is None or s == side)]
        return merge_windows(rows)

    async def freeze(self, model: str, baseline: Baseline) -> None:
        with self._state.lock:
            for side in SIDES:
                ints, floats = to_fields(baseline.sides.get(side, Summary()))
                self._state.set(f"out-base:{model}:{baseline.label}:{side}",
                                {**ints, **floats})
            self._state.set(f"out-base:{model}:{baseline.label}",
                            (baseline.frozen_at, baseline.since_s))

    async def baselines(self, model: str, labels: Iterable[str]) -> dict[str, Baseline]:
        out: dict[str, Baseline] = {}
        with self._state.lock:
            for label in sorted(set(labels)):
                meta = self._state.get(f"out-base:{model}:{label}")
                if meta is None:
                    continue
                out[label] = Baseline(label, meta[0], meta[1], {
                    side: from_fields(self._state.get(f"out-base:{model}:{label}:{side}")
                                      or {}) for side in SIDES})
        return out
