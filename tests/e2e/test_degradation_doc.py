"""docs/degradation.md's worked example runs as written: its two modules, its worker
command (only the broker URL swapped for the test's Redis) and its client snippet, whose
output must be the page's."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from batchfleet import Client
from batchfleet.schemas.registry import UnregisteredModelError

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "degradation.md"
URL = "redis://localhost:6379/0"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_worked_example_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    python = _blocks("python")
    (tmp_path / "fraud_model.py").write_text(next(b for b in python if "FraudScorer" in b))
    (tmp_path / "fraud_rules.py").write_text(next(b for b in python if "def score" in b))
    client_code = next(b for b in python if "Client(" in b)
    [command] = _blocks("bash")
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["PYTHONPATH=.", "batchfleet"]
    argv = [redis_url if a == URL else a for a in argv[2:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    worker = subprocess.Popen([sys.executable, "-m", "batchfleet", *argv], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cwd = os.getcwd()
    try:
        deadline = time.monotonic() + 90
        with Client(redis_url) as client:  # ready once it serves the model
            while True:
                assert worker.poll() is None, worker.communicate()[1].decode()[-2000:]
                try:
                    rid = client.submit("fraud", np.zeros(10, np.float32))
                    break
                except UnregisteredModelError:
                    assert time.monotonic() < deadline, "the worker did not start in 90 s"
                    time.sleep(0.2)
            warm = client.wait(rid, timeout=90)
        assert warm.status == "succeeded" and not warm.degraded
        (tmp_path / "OUTAGE").touch()
        out = io.StringIO()
        os.chdir(tmp_path)
        with contextlib.redirect_stdout(out):
            exec(compile(client_code.replace(URL, redis_url), f"{DOC}:client", "exec"),
                 {"__name__": "__doc_example__"})
    finally:
        os.chdir(cwd)
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    printed = next(b for b in _blocks("text") if "succeeded True" in b)
    assert out.getvalue() == printed, err.decode()[-2000:]
