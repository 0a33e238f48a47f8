"""Ctrl-C while a worker's models load exits at once (status 130).

The models build on the compute thread (``workers.compute.compute_pool``), which a signal
cannot interrupt; without ``abandon_loading_models`` the process would wait for the load
to end before exiting (30 s here, minutes for a large model)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

FACTORY = """
import pathlib, time, torch
def build():
    pathlib.Path({marker!r}).touch()
    time.sleep(120)
    return torch.nn.Linear(4, 4)
"""

#: A background job's SIGINT may be ignored (and exec keeps it so); a terminal's is not.
DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'batchfleet', *sys.argv[1:]])")


def test_ctrl_c_while_the_models_load_exits_without_waiting_for_them(
        tmp_path: Path, redis_url: str) -> None:
    marker = tmp_path / "loading"
    (tmp_path / "slowbuild.py").write_text(FACTORY.format(marker=str(marker)))
    proc = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT, "worker", "--broker", redis_url,
         "--model", "slow=slowbuild:build", "--app-dir", str(tmp_path),
         "--input-spec", "float32[4]", "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "never began loading"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130  # liveness bound; the load alone takes 120 s
        _, err = proc.communicate()
        assert "interrupted while the models load" in err
        assert "worker ready" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
