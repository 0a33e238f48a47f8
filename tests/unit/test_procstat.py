"""The bench's CPU meter: nanosecond-exact over a short window, ticks when a thread exits."""

from __future__ import annotations

import os
import threading
import time

from batchfleet.bench.procstat import MACHINE, CpuMeter, CpuSnapshot


def _spin(seconds: float) -> None:
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


def test_a_window_shorter_than_a_clock_tick_still_reads_its_cpu() -> None:
    meter = CpuMeter({"me": os.getpid()})
    before = meter.snapshot(time.time())
    _spin(0.004)  # under the 10 ms tick that /proc/PID/stat counts in
    used = CpuMeter.usage(before, meter.snapshot(time.time()))
    assert 0.004 <= used["me"] < 1.0
    assert used["other"] >= 0 and MACHINE in used


def test_a_thread_that_exits_in_the_window_falls_back_to_ticks() -> None:
    meter = CpuMeter({"me": os.getpid()})
    worker = threading.Thread(target=_spin, args=(0.05,))
    worker.start()
    before = meter.snapshot(time.time())
    worker.join()  # its nanosecond count leaves with it; the process's ticks keep it
    after = meter.snapshot(time.time())
    assert not before.threads["me"].keys() <= after.threads["me"].keys()
    assert CpuMeter.usage(before, after)["me"] == round(
        after.seconds["me"] - before.seconds["me"], 4)


def test_a_snapshot_without_thread_readings_uses_ticks() -> None:
    start = CpuSnapshot(0.0, {"w": 1.0, MACHINE: 5.0})
    end = CpuSnapshot(1.0, {"w": 1.25, MACHINE: 6.0})
    assert CpuMeter.usage(start, end) == {"w": 0.25, MACHINE: 1.0, "other": 0.75}
