"""The same small piece of Python work, timed on the CPU back to back and after a sleep:
``python -m tests.support.wake_cost``.

On a shared virtual machine the core a process sleeps on runs other work meanwhile, so
its caches and branch predictors are cold when it wakes, and the next stretch of Python
runs slower. This prints the median CPU time (``time.thread_time``) of one unit of
msgpack and json work (about 25 us warm) right after the previous one, and after
sleeps of 0.2, 1 and 5 ms. docs/performance.md, "CPU per request rises as load falls",
quotes it.
"""

from __future__ import annotations

import json
import statistics
import time

import msgpack

_DATA = {"a": list(range(50)), "b": "x" * 100}


def _unit() -> None:
    msgpack.unpackb(msgpack.packb(_DATA))
    json.dumps(_DATA)


def cpu_us_after(gap_s: float, repeats: int = 400, skip: int = 50) -> float:
    """Median CPU microseconds of one unit after sleeping ``gap_s`` (0: back to back)."""
    times: list[float] = []
    for _ in range(repeats):
        if gap_s:
            time.sleep(gap_s)
        start = time.thread_time()
        _unit()
        times.append(time.thread_time() - start)
    return statistics.median(times[skip:]) * 1e6


def main() -> None:
    for gap_s in (0.0, 0.0002, 0.001, 0.005):
        print(f"after {gap_s * 1000:.1f} ms asleep: {cpu_us_after(gap_s):6.1f} us of CPU",
              flush=True)


if __name__ == "__main__":
    main()
