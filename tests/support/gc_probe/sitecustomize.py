"""Every garbage collection of a process, timed: the method behind docs/performance.md,
"Garbage collection". Not imported by anything; put this folder first on PYTHONPATH and
every Python process started with that environment (the bench's workers and producers
included) writes ``$GC_PROBE_DIR/<pid>.txt`` at exit: per generation the collections,
their total and longest pause, and each full collection's pause in order.

    mkdir -p /tmp/gcstats
    GC_PROBE_DIR=/tmp/gcstats PYTHONPATH=tests/support/gc_probe \\
        batchfleet bench --quick -m demo-mlp -t redis --no-rq --no-broker-loop --no-sweep
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
from typing import Any

_OUT = os.environ.get("GC_PROBE_DIR", "/tmp/gcstats")
_started = [0.0]
#: generation -> [collections, total s, longest s]
_stats: dict[int, list[float]] = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}
_full_pauses_ms: list[float] = []


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    row = _stats[info["generation"]]
    row[0] += 1
    row[1] += took
    row[2] = max(row[2], took)
    if info["generation"] == 2:
        _full_pauses_ms.append(round(took * 1000.0, 1))


def _write() -> None:
    with open(os.path.join(_OUT, f"{os.getpid()}.txt"), "w") as out:
        out.write(" ".join(sys.argv[:3]) + "\n")
        out.write(f"full collections, ms in order: {_full_pauses_ms}\n")
        for gen, (n, total, longest) in _stats.items():
            out.write(f"gen{gen}: {int(n)} collections, {total * 1000:.1f} ms in all, "
                      f"longest {longest * 1000:.2f} ms\n")


gc.callbacks.append(_timed)
atexit.register(_write)
