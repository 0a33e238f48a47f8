"""docs/models.md runs as written: its files are the example's, and its commands, run in
``examples/textclf`` against a real Redis and worker process, print what it says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "models.md"
EXAMPLE = ROOT / "examples" / "textclf"
#: The console script a user runs (``python -m`` would put the working directory on the
#: path by itself, hiding whether the worker does).
BATCHFLEET = str(Path(sys.executable).with_name("batchfleet"))
#: The guide's shell lines, in order. The test starts its own Redis and sets the variable
#: and folder those lines set; it runs every other line as written.
COMMANDS = [
    "redis-server --port 6379 --daemonize yes",
    "export BATCHFLEET_BROKER=redis://localhost:6379/0",
    "cd examples/textclf",
    "batchfleet models check textclf.model:build",
    "batchfleet worker -m textclf=textclf.model:build &",
    "python classify.py",
    "python -m pytest -q test_textclf.py",
]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(), re.DOTALL)


def test_the_guides_files_are_the_examples() -> None:
    python = _blocks("python")
    for name in ("textclf/model.py", "classify.py", "test_textclf.py"):
        assert (EXAMPLE / name).read_text() in python, f"docs/models.md lacks {name} as is"


def _argv(line: str) -> list[str]:
    argv = shlex.split(line.removesuffix("&").strip())
    return [{"batchfleet": BATCHFLEET, "python": sys.executable}.get(argv[0], argv[0]),
            *argv[1:]]


def test_the_guide_runs_as_written(redis_url: str, tmp_path: Path) -> None:
    lines = [line.strip() for block in _blocks("bash") for line in block.splitlines()
             if line.strip()]
    assert lines == COMMANDS
    env = {**os.environ, "BATCHFLEET_BROKER": redis_url, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "worker.log"
    outputs: dict[str, str] = {}
    worker: subprocess.Popen[bytes] | None = None
    try:
        for line in lines[3:]:
            if line.endswith("&"):
                with log.open("wb") as sink:
                    worker = subprocess.Popen(_argv(line), cwd=EXAMPLE, env=env,
                                              stdout=sink, stderr=subprocess.STDOUT)
                for _ in range(1200):  # liveness only: the worker imports torch and trains
                    if "worker ready" in log.read_text() or worker.poll() is not None:
                        break
                    time.sleep(0.05)
                assert "worker ready" in log.read_text(), log.read_text()[-3000:]
                continue
            done = subprocess.run(_argv(line), cwd=EXAMPLE, env=env, capture_output=True,
                                  text=True, timeout=180, check=False)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            outputs[line] = done.stdout
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(60)
    check = outputs["batchfleet models check textclf.model:build"]
    assert "textclf (version textclf-1): loaded in" in check
    assert "input uint8[256], output float32[2]: 4 sample inputs passed" in check
    assert re.search(r"^32\s+[0-9.]+\s+[0-9.]+", check, re.MULTILINE), check
    said = outputs["python classify.py"].splitlines()
    assert said[0].startswith("positive  'I love it, works great'")
    assert said[1].startswith("negative  'terrible, it broke after a day'")
    assert said[2].startswith("failed validation_error attempts=1 not UTF-8 text")
    assert "2 passed" in outputs["python -m pytest -q test_textclf.py"]
    assert worker is not None and worker.returncode == 0, log.read_text()[-3000:]


def test_the_readme_points_to_the_guide_from_its_first_screen() -> None:
    first_screen = (ROOT / "README.md").read_text().splitlines()[:25]
    assert any("(docs/models.md)" in line for line in first_screen)
