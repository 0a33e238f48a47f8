"""CPU time of processes, read from ``/proc``, so each component's share of the CPUs is known.

The worker's CPU per request (excluding the model) is derived from these
readings; the other processes (client, Redis, Kafka) are read the same way to
show honestly what shares the machine with the worker.

``/proc/PID/stat`` counts in clock ticks (10 ms), too coarse for a short window:
a tiny run's worker can burn 30 ms and read as 0 or 10. Each thread's
``schedstat`` counts nanoseconds, but a thread that exits takes its count with it,
so a window's usage is the nanosecond difference when every thread seen at its
start is still alive at its end, and the tick difference otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
#: The label under which a snapshot also records machine-wide busy CPU time.
MACHINE = "machine"


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0.0 once it has gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may contain spaces; fields resume after its ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def thread_cpu_ns(pid: int) -> dict[int, tuple[int, int]]:
    """Each live thread of ``pid``: (nanoseconds on a CPU, nanoseconds runnable but
    waiting for one); empty once it has gone."""
    found: dict[int, tuple[int, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            run, wait = (task / "schedstat").read_text().split()[:2]
            found[int(task.name)] = (int(run), int(wait))
        except (OSError, ValueError, IndexError):
            continue
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the servers and workers the bench started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        if int(raw[raw.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def system_busy_seconds() -> float:
    """CPU seconds spent busy machine-wide (all CPUs, everything but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in fields]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds per labelled process at one wall-clock instant."""

    wall: float
    seconds: dict[str, float]
    #: Per label, (on-CPU, run-queue wait) nanoseconds of each thread alive at the snapshot.
    threads: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)


class CpuMeter:
    """Labelled processes whose CPU time is read together, so a window's usage is a difference.

    A label may name several processes (the producer processes are one ``client``);
    their CPU times are summed.
    """

    def __init__(self, pids: Mapping[str, int | Sequence[int]]) -> None:
        self.pids: dict[str, tuple[int, ...]] = {
            label: (pid,) if isinstance(pid, int) else tuple(pid) for label, pid in pids.items()}

    def snapshot(self, wall: float) -> CpuSnapshot:
        seconds = {label: sum(cpu_seconds(pid) for pid in pids)
                   for label, pids in self.pids.items()}
        threads = {label: {tid: ns for pid in pids for tid, ns in thread_cpu_ns(pid).items()}
                   for label, pids in self.pids.items()}
        seconds[MACHINE] = system_busy_seconds()
        return CpuSnapshot(wall, seconds, threads)

    @staticmethod
    def usage(start: CpuSnapshot, end: CpuSnapshot) -> dict[str, float]:
        """CPU seconds used between two snapshots: per process, ``other`` and the machine.

        ``other`` is machine-wide busy time not accounted to a labelled process:
        anything else running on the box during the window (kernel, other jobs).
        """
        used = {label: round(_used(label, start, end), 4) for label in end.seconds}
        ours = sum(v for k, v in used.items() if k != MACHINE)
        used["other"] = round(max(0.0, used[MACHINE] - ours), 4)
        return used

    def thread_split(self, start: CpuSnapshot, end: CpuSnapshot,
                     label: str) -> dict[str, float]:
        """A process's main thread (its event loop, for a worker) apart from the rest.

        ``loop_cpu_s``: the main threads' on-CPU seconds in the window; ``loop_wait_s``:
        their seconds runnable but waiting for a CPU (another process or thread had it);
        ``threads_cpu_s``: every other thread (compute, torch/OpenMP, helpers) on a CPU;
        ``wall_s``: the wall time between the two snapshots.
        Empty when a thread seen at the start had exited by the end (its count left
        with it) or the label was not read.
        """
        before, after = start.threads.get(label), end.threads.get(label)
        if not before or not after or not before.keys() <= after.keys():
            return {}
        mains = set(self.pids.get(label, ()))

        def delta(tid: int, field_: int) -> int:
            return after[tid][field_] - before.get(tid, (0, 0))[field_]

        return {"wall_s": round(end.wall - start.wall, 4),
                "loop_cpu_s": round(sum(delta(t, 0) for t in after if t in mains) / 1e9, 4),
                "loop_wait_s": round(sum(delta(t, 1) for t in after if t in mains) / 1e9, 4),
                "threads_cpu_s": round(
                    sum(delta(t, 0) for t in after if t not in mains) / 1e9, 4)}


def _used(label: str, start: CpuSnapshot, end: CpuSnapshot) -> float:
    """Nanosecond-exact where no thread exited in the window; clock ticks otherwise."""
    before, after = start.threads.get(label), end.threads.get(label)
    if before and after and before.keys() <= after.keys():
        return (sum(v[0] for v in after.values()) - sum(v[0] for v in before.values())) / 1e9
    return end.seconds[label] - start.seconds.get(label, 0.0)
