"""``WorkerProcess`` starts one child, however it is entered: a second start would leak
the first, which then runs on after its test (it did, in the lane-shards test)."""

from __future__ import annotations

import pytest

from batchfleet.processes import WorkerProcess
from batchfleet.schemas.errors import ConfigError

pytestmark = pytest.mark.integration


def test_a_started_worker_process_is_not_started_again(redis_url: str) -> None:
    worker = WorkerProcess(redis_url).start()
    first = worker.proc
    try:
        with pytest.raises(ConfigError, match="already started"):
            worker.start()
        with worker as entered:  # entering a started one keeps its process
            assert entered is worker and worker.proc is first
        assert first is not None and first.poll() is not None  # and exit stopped it
    finally:
        worker.kill()
