"""The bench measures a ``--redis`` server that runs on this machine as Redis, not as
other people's load (``bench.fleet.Services.server_pids``).

Only servers the bench started itself were found (its children). A local Redis given by
URL counted as "other": every measured window looked noisy and was retried, and the
report warned that the machine was busy (0.62 cores of "other" in a run against a local
Redis, all of it Redis).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from batchfleet.bench import fleet
from batchfleet.bench.fleet import Services, local_redis_pid
from batchfleet.bench.procstat import children
from batchfleet.connectors.embedded_redis import find_redis_server
from batchfleet.connectors.embedded_server import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def daemon_redis(tmp_path: Path) -> Iterator[tuple[int, Path, int]]:
    """A redis-server that is not this process's child (it daemonizes): port, socket, PID."""
    port, sock, pidfile = free_port(), tmp_path / "r.sock", tmp_path / "r.pid"
    subprocess.run([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1",
                    "--unixsocket", str(sock), "--unixsocketperm", "700", "--daemonize", "yes",
                    "--pidfile", str(pidfile), "--save", "", "--dir", str(tmp_path),
                    "--logfile", str(tmp_path / "r.log")], check=True, timeout=30)
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping() and pidfile.exists() and pidfile.read_text().strip():
                    break
            except redis.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the daemonized redis-server never answered"
            time.sleep(0.05)
        yield port, sock, int(pidfile.read_text())
    finally:
        with contextlib.suppress(redis.ConnectionError):  # it went down as it answered
            client.shutdown(nosave=True)


def test_a_local_redis_given_by_url_is_measured_as_redis(
        daemon_redis: tuple[int, Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    port, sock, pid = daemon_redis
    assert pid not in children(os.getpid())  # not started by us: the old lookup missed it
    assert local_redis_pid(f"redis://127.0.0.1:{port}/0") == pid
    assert local_redis_pid(f"unix://{sock}?db=0") == pid
    # the bench process has no server children of its own when given --redis; this test
    # process has the suite's, so the lookup is shown with none
    monkeypatch.setattr(fleet, "children", lambda _pid: [])
    assert Services(f"redis://localhost:{port}/0", None).server_pids() == {"redis": pid}


def test_a_remote_or_silent_redis_is_not_measured() -> None:
    assert local_redis_pid("redis://10.255.255.1:6379/0") is None  # not loopback: not dialled
    assert local_redis_pid(f"redis://127.0.0.1:{free_port()}/0") is None  # nobody answers
