"""How fast the host ran during a bench, so that two runs can be compared.

Why: on a shared virtual machine the same code runs up to twice as slowly on a bad
stretch. In the 2026-11-29 full run every baseline moved together (RQ 129 against 235
jobs/s, the broker-only loop 66,640 against 125,765 msg/s a few hours apart), which a CPU
time per request cannot tell from a regression. Two readings frame each run:

* a fixed single-threaded probe of the bench's own kind of work (msgpack round trips of
  a request-sized map and small Python calls), timed on an otherwise idle machine at the
  start and at the end: microseconds per round of work, lower is faster;
* a wake-up probe: one byte bounced between this process and a child over a socket pair,
  microseconds per round trip. Each trip is two sleeps, two wake-ups and four system
  calls, what every request costs the fleet between its processes; the msgpack probe
  never leaves one process, and in 2026-11-29's runs it missed a stretch where the whole
  machine ran about 15% faster. Between hosts, a synchronous Redis ``PING`` cost 37, 88
  and 142 us of CPU where the msgpack probe differed far less;
* the share of CPU time the hypervisor took from this machine over the run (``steal``
  in ``/proc/stat``; 0 where the kernel does not report it).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
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


#: Round trips per timed round of the wake-up probe (about 0.1 s in all here).
_TRIPS = 200
#: The child: echo each byte back until the socket closes.
_ECHO = ("import socket, sys\n"
         "s = socket.socket(fileno=int(sys.argv[1]))\n"
         "while (b := s.recv(1)):\n"
         "    s.sendall(b)\n")


def wakeup_probe_us(rounds: int = _ROUNDS, trips: int = _TRIPS) -> float:
    """Median wall time of one round trip of a byte to a child process and back, in
    microseconds (median over ``rounds`` rounds of ``trips`` trips each)."""
    mine, theirs = socket.socketpair()
    with mine:
        try:
            child = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        mine.settimeout(10.0)  # a child that died must not hang the bench

        def bounce(n: int) -> None:
            for _ in range(n):
                mine.sendall(b"x")
                if not mine.recv(1):
                    raise ConnectionError("the wake-up probe's child went away")

        try:
            bounce(20)  # warm: the child's start-up, the first wake-ups
            times = []
            for _ in range(rounds):
                began = time.perf_counter()
                bounce(trips)
                times.append((time.perf_counter() - began) * 1e6 / trips)
        finally:
            mine.close()  # the child reads the end of its socket and exits
            try:
                child.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
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
