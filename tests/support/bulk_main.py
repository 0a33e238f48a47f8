"""The input files and reference outputs the bulk tests share, and the command that
starts a bulk job as a real subprocess (so tests can SIGKILL it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

BULK_COMMAND = [sys.executable, "-m", "batchfleet", "bulk"]

#: Runs the command after the file name and writes the command's peak RSS (bytes) there.
#: The command must be started from a small process like this one, not from the test
#: process: Linux keeps a process's peak RSS across exec, so a child forked from a big
#: test process (torch, a worker) reports that process's size, not its own.
_PEAK_RSS = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss_command(rss_file: Path, command: list[str]) -> list[str]:
    """``command``, wrapped so that its own peak RSS ends up in ``rss_file``."""
    return [sys.executable, "-c", _PEAK_RSS, str(rss_file), *command]


def mlp_inputs(n: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng(seed).random((n, 10), dtype=np.float32)


def mlp_reference(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """demo-mlp run locally, in one batch: what every bulk output is checked against."""
    import torch

    from batchfleet.workers.models import build_mlp

    with torch.inference_mode():
        return build_mlp()(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def write_jsonl(path: Path, x: np.ndarray[Any, Any], extra: dict[int, list[str]] | None = None
                ) -> None:
    """One {"custom_id": "c<i>", "inputs": [...]} per row; ``extra`` lines go before row i."""
    extra = extra or {}
    with path.open("w") as f:
        for i, row in enumerate(x.tolist()):
            for line in extra.get(i, []):
                f.write(line + "\n")
            f.write(json.dumps({"custom_id": f"c{i}", "inputs": row}) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]

