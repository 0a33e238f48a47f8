"""The bench's CPU meter: nanosecond-exact over a short window, ticks when a thread exits."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

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
    tids: list[int] = []
    go = threading.Event()

    def spin() -> None:
        tids.append(threading.get_native_id())
        go.wait()
        _spin(0.05)

    worker = threading.Thread(target=spin)
    worker.start()
    while not tids:
        time.sleep(0.001)
    before = meter.snapshot(time.time())
    assert tids[0] in before.threads["me"]
    go.set()
    worker.join()  # its nanosecond count leaves with it; the process's ticks keep it
    deadline = time.monotonic() + 10
    while Path(f"/proc/{os.getpid()}/task/{tids[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    after = meter.snapshot(time.time())
    assert tids[0] not in after.threads["me"]
    assert CpuMeter.usage(before, after)["me"] == round(
        after.seconds["me"] - before.seconds["me"], 4)
    assert meter.thread_split(before, after, "me") == {}


def test_the_main_thread_is_split_from_the_others() -> None:
    meter = CpuMeter({"me": os.getpid()})
    go, done = threading.Event(), threading.Event()

    def spin() -> None:
        go.wait()
        _spin(0.03)
        done.set()
        time.sleep(0.5)  # still alive at the second snapshot

    worker = threading.Thread(target=spin, daemon=True)
    worker.start()
    before = meter.snapshot(time.time())
    go.set()
    _spin(0.02)
    done.wait(10)
    split = meter.thread_split(before, meter.snapshot(time.time()), "me")
    assert split["loop_cpu_s"] >= 0.02 and split["threads_cpu_s"] >= 0.03
    assert split["loop_wait_s"] >= 0


def test_a_snapshot_without_thread_readings_uses_ticks() -> None:
    start = CpuSnapshot(0.0, {"w": 1.0, MACHINE: 5.0})
    end = CpuSnapshot(1.0, {"w": 1.25, MACHINE: 6.0})
    assert CpuMeter.usage(start, end) == {"w": 0.25, MACHINE: 1.0, "other": 0.75}
