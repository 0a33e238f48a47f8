"""docs/cluster.md's quick start runs as written against a real Redis Cluster (issue 25,
item 20): its worker starts (``--no-webhooks``), its submit is answered, and ``status``
names the broker a cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_cluster import RedisClusterServers

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()


def _quick_start() -> str:
    section = DOC[DOC.index("## Quick start"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    return block.group(1)


def test_the_quick_start_runs_as_written(redis_cluster_servers: RedisClusterServers,
                                         tmp_path: Path) -> None:
    script = _quick_start()
    # the one change: the example's seed list becomes this cluster's
    script = re.sub(r"(?m)^export CLUSTER=.*$", f"export CLUSTER={redis_cluster_servers.url}",
                    script)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "BATCHFLEET_NAMESPACE": f"docs{os.getpid()}"}
    # the worker was started with `&`: stop it at the end, as a reader's Ctrl-C would
    full = f"set -e\ntrap 'kill %1 2>/dev/null; wait' EXIT\n{script}"
    proc = subprocess.run(["bash", "-c", full], env=env, capture_output=True, text=True,
                          timeout=180, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"status": "succeeded"' in proc.stdout or "succeeded" in proc.stdout
    assert "on redis cluster" in proc.stdout
