"""How fast the host ran during a bench, so that two runs can be compared.

Why: on a shared virtual machine the same code runs up to twice as slowly on a bad
stretch. In the 2026-11-29 full run every baseline moved together (RQ 129 against 235
jobs/s, the broker-only loop 66,640 against 125,765 msg/s a few hours apart), which a CPU
time per request cannot tell from a regression. Two readings frame each run:

* a fixed single-threaded probe of the bench's own kind of work (msgpack round trips of
  a request-sized map and small Python calls), timed on an otherwise idle machine at the
  start and at the end: microseconds per round of work, lower is faster;
* the share of CPU time the hypervisor took from this machine over the run (``steal``
  in ``/proc/stat``; 0 where the kernel does not report it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import msgpack

#: Round trips per timed round, and timed rounds per probe (about 0.15 s in all here:
#: this host's speed moves by a third from one tenth of a second to the next, so a probe
#: of a few rounds reads a moment, fifteen a stretch).
_WORK = 2000
_ROUNDS = 15
_SAMPLE = {"id": "0123456789abcdef", "model": "demo-mlp", "lane": "interactive",
           "inputs": b"\x00" * 40, "shape": [1, 10], "gen": 0, "at": 1.5e9}


def _one_round() -> None:
    packb, unpackb = msgpack.packb, msgpack.unpackb
    seen = []
    for i in range(_WORK):
        decoded = unpackb(packb(_SAMPLE))
        seen.append(len(decoded["id"]) + i)


def speed_probe_us() -> float:
    """Median wall time of one round of the probe's fixed work, in microseconds."""
    _one_round()  # warm: imports, allocator
    times = []
    for _ in range(_ROUNDS):
        began = time.perf_counter()
        _one_round()
        times.append((time.perf_counter() - began) * 1e6)
    return round(statistics.median(times), 1)


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(stolen, total) clock ticks of all CPUs since boot; (0, 0) where unreadable."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return 0, 0
    if not fields or fields[0] != "cpu":
        return 0, 0
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (values[7] if len(values) > 7 else 0), sum(values)


def steal_pct(start: tuple[int, int], end: tuple[int, int]) -> float:
    """Percent of the CPUs' time between two :func:`cpu_ticks` readings that was stolen."""
    stolen, total = end[0] - start[0], end[1] - start[1]
    return round(100.0 * stolen / total, 2) if total > 0 else 0.0
