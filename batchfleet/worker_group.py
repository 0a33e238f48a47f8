"""``batchfleet worker --processes N``: N worker processes from one command.

Why: on a GPU a small model leaves one worker bound by its own Python (its event loop
and compute thread share one interpreter lock); two or more processes share the device,
each with its own interpreter (docs/performance.md, "On a GPU: several workers per
GPU"). One container and one GPU then carry N workers without device-plugin sharing.

The parent runs no worker and imports no torch. It starts N children with the same
options, each its own consumer (``--worker-id ID-1`` .. ``ID-N``) and, with
``--metrics-port P``, its own port ``P + i`` (the first keeps ``P``: the probes' port).
It forwards SIGTERM and SIGINT to every child and returns once all have exited. A child
that exits on its own ends the group: the others are stopped as by SIGTERM (they drain)
and the parent exits with that child's code, so an orchestrator restarts the whole and
never runs a group with a hole in it. With a fixed ``--metrics-port`` the parent also
watches each process's ``/healthz`` (``batchfleet.group_health``): one that stops
answering stops the group too, since the orchestrator's probe reaches only the first.
A process still running ``--grace-s`` + :data:`KILL_MARGIN_S` after it was told to stop
is killed, so a wedged one cannot hold the group. On Linux a child gets SIGTERM if the
parent dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from batchfleet.group_health import EXIT_UNRESPONSIVE, MISSES, HealthWatch, probe_host

#: How often the parent looks for a child that has exited.
POLL_S = 0.2
#: Seconds past ``--grace-s`` a process told to stop may take before it is killed.
KILL_MARGIN_S = 15.0
_PR_SET_PDEATHSIG = 1


def child_args(index: int, worker_id: str, metrics_port: int | None) -> list[str]:
    """What child ``index`` (from 0) appends to the group's options: a later flag wins, so
    these override whatever the command line or the environment said."""
    args = ["--processes", "1", "--worker-id", f"{worker_id}-{index + 1}"]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
    return args


def exit_code(returncode: int) -> int:
    """A child's code as a shell reports it: killed by signal N is 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


def group_exit_code(first: int, others: Sequence[int], stopping: bool) -> int:
    """The parent's exit code from the children's return codes. Stopped by a signal: the
    worst child's (0 when all drained cleanly). A child that ended on its own: its code,
    and 1 where that was 0, since a worker never exits cleanly unasked."""
    if stopping:
        return max(exit_code(code) for code in (first, *others))
    return exit_code(first) or 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_group(options: Sequence[str], count: int, worker_id: str,
              metrics_port: int | None, metrics_host: str = "0.0.0.0",
              grace_s: float = 30.0) -> int:
    """Run ``count`` ``batchfleet worker`` children with ``options``; their exit code."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # installed first: a stop asked for while the children start reaches every one
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i in range(count):
            if stopping:
                break
            # preexec_fn is safe here: the parent has started no thread (no torch, no loop)
            children.append(subprocess.Popen(
                [sys.executable, "-m", "batchfleet", "worker", *options,
                 *child_args(i, worker_id, metrics_port)],
                preexec_fn=_die_with_parent if sys.platform == "linux" else None))  # noqa: PLW1509
        if stopping:  # a signal during the starts: the last children never saw it
            forward(signal.SIGTERM, None)
        if not children:
            return 0
        ports = [metrics_port + i for i in range(len(children))] if metrics_port else []
        watch = HealthWatch(probe_host(metrics_host), ports) if ports else None
        first: subprocess.Popen[bytes] | None = None
        while not stopping and (first := _exited(children)) is None:
            silent = None if watch is None else watch.check(time.monotonic())
            if silent is not None:
                _say(f"worker process {silent + 1} of {count} stopped answering /healthz "
                     f"on port {ports[silent]} ({MISSES} checks in a row); stopping the group")
                _stop_all(children)
                _reap(children, grace_s + KILL_MARGIN_S)
                return EXIT_UNRESPONSIVE
            time.sleep(POLL_S)
        if first is not None and not stopping:
            how = (f"was killed by {signal.Signals(-first.returncode).name}"
                   if first.returncode < 0 else f"exited with code {first.returncode}")
            _say(f"worker process {children.index(first) + 1} of {count} {how}; "
                 f"stopping the others")
            _stop_all(children)
        codes = _reap(children, grace_s + KILL_MARGIN_S)
        first = first or children[0]
        return group_exit_code(first.returncode,
                               [c for child, c in zip(children, codes, strict=True)
                                if child is not first], stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _say(line: str) -> None:
    print(f"batchfleet: {line}", file=sys.stderr, flush=True)


def _exited(children: Sequence[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes] | None:
    return next((child for child in children if child.poll() is not None), None)


def _stop_all(children: Sequence[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)


def _reap(children: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Every child's return code, killing those still running ``timeout_s`` from now."""
    deadline = time.monotonic() + timeout_s
    for i, child in enumerate(children):
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"worker process {i + 1} of {len(children)} did not stop within "
                 f"{timeout_s:g} s; killing it")
            child.kill()
            child.wait()
    return [child.returncode for child in children]
