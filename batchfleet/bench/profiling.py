"""py-spy on the worker (and the client), and a ranking of where their CPU goes.

py-spy samples a process from outside, so the worker runs unmodified. It
still costs the sampled process something, so profiled passes are separate
from the measured ones and their numbers are never reported as results.
Stacks are recorded in py-spy's raw (collapsed) format and ranked here by
self time and by inclusive time, per thread role: the event loop (fetch,
decode, batching, result writes, acks) versus the compute thread (the model).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SAMPLE_RATE_HZ = 250
_TOP = 15
#: Where batchfleet's own code lives (py-spy prints paths relative to the working directory).
PROJECT_PATHS = ("workers/", "connectors/", "schemas/", "producers/", "batchfleet/")
#: Entry points and drivers: in every sample of their thread, so they rank nothing.
_ENTRY_FILES = ("batchfleet/__main__.py", "batchfleet/cli.py", "batchfleet/cli_bench.py",
                "batchfleet/bench/run.py")
_ENTRY_FUNCTIONS = ("Worker.run", "Worker.async_run", "run_scenario", "drive", "_profiled")


def _is_project_frame(frame: str) -> bool:
    name, _, where = frame.partition(" (")
    return (where.startswith(PROJECT_PATHS) and not where.startswith(_ENTRY_FILES)
            and name not in _ENTRY_FUNCTIONS)


def find_py_spy() -> str | None:
    """py-spy next to this interpreter (a venv install) or on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


@contextmanager
def py_spy(pid: int, raw_path: Path) -> Iterator[Path]:
    """Record ``pid`` until the block ends; stacks land in ``raw_path`` (collapsed format)."""
    exe = find_py_spy()
    if exe is None:
        raise FileNotFoundError("py-spy is not installed: pip install py-spy")
    raw_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ), "--format", "raw",
         "--output", str(raw_path), "--nonblocking", "--threads"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield raw_path
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def thread_role(thread: str, frames: list[str]) -> str:
    """Which part of the process a stack belongs to: by thread name, else by its frames.

    ``--threads`` puts ``thread (TID): NAME`` first; the worker's model runs in the
    ``compute_*`` executor thread and everything else on the event loop in MainThread.
    """
    name = thread.rpartition(": ")[2]
    joined = ";".join(frames)
    if name.startswith("compute") or "concurrent/futures/thread.py" in joined:
        return "compute thread"
    if name == "MainThread" or "run_forever" in joined:
        return "event loop"
    return f"other ({name})" if name else "other"


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: merge a function's lines."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})" if path else name


def summarize(raw_path: Path, top: int = _TOP) -> dict[str, Any]:
    """Rank functions by share of non-idle samples: self, inclusive, and per thread role."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    project: dict[str, Counter[str]] = {}
    roles: Counter[str] = Counter()
    role_self: dict[str, Counter[str]] = {}
    total = 0
    if raw_path.exists():
        for line in raw_path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            parts = stack.split(";")
            thread = next((f for f in parts if f.startswith("thread (")), "")
            frames = [f for f in parts if not f.startswith(("process ", "thread ("))]
            if not frames:
                continue
            total += n
            role = thread_role(thread, frames)
            roles[role] += n
            leaf = _short(frames[-1])
            self_time[leaf] += n
            role_self.setdefault(role, Counter())[leaf] += n
            for fn in {_short(f) for f in frames}:
                inclusive[fn] += n
            mine = project.setdefault(role, Counter())
            for fn in {_short(f) for f in frames if _is_project_frame(f)}:
                mine[fn] += n

    def pct(counter: Counter[str], limit: int) -> list[dict[str, Any]]:
        return [{"function": fn, "pct": round(100.0 * c / total, 2)}
                for fn, c in counter.most_common(limit)] if total else []

    # What is left once entry points are dropped ranks batchfleet's own functions by
    # inclusive time; anything in 90% of its thread's samples is a driver, not a cost.
    ours: Counter[str] = Counter()
    for role, counts in project.items():
        ours.update({fn: c for fn, c in counts.items() if c < 0.9 * roles[role]})
    return {"samples": total, "raw": str(raw_path),
            "project_inclusive": pct(ours, top * 2),
            "roles": {r: round(100.0 * c / total, 2) for r, c in roles.most_common()}
            if total else {},
            "self": pct(self_time, top), "inclusive": pct(inclusive, top * 2),
            "self_by_role": {r: pct(c, top) for r, c in role_self.items()}}
