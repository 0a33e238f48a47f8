"""The README's "Use it" shell block runs as pasted (issue 25, item 19): the worker goes
to the background, the submits after it run and are answered, and the worker stops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _use_it_block() -> str:
    section = README[README.index("Start a worker against any Redis"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    return block.group(1)


def test_the_use_it_block_runs_as_pasted(redis_url: str, tmp_path: Path) -> None:
    script = _use_it_block().replace("redis://localhost:6379/0", redis_url)  # its own Redis
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHFLEET_")}
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(["bash", "-c", f"set -e\n{script}\nwait"], env=env,
                          capture_output=True, text=True, timeout=180, check=False,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("succeeded") == 2  # the waited submit, then the result read
