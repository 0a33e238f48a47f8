"""A benchmark worker leaves no log file behind after a clean exit (issue 25, item 17)."""

from __future__ import annotations

import pytest

from batchfleet.bench import fleet

pytestmark = pytest.mark.integration


def test_a_bench_worker_removes_its_log_when_it_exits_cleanly(redis_url: str) -> None:
    svc = fleet.Services(redis_url, None)
    with fleet.worker(svc, "redis", "demo-mlp", 32, 5.0, fleet.new_namespace("logs")) as proc:
        log = proc.log_path
        assert log.exists()
    assert proc.proc is not None and proc.proc.returncode == 0
    assert not log.exists()
