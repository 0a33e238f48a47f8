"""``batchfleet worker --processes N``: N consumers from one command, stopped together.

Real processes on a real Redis: the group serves requests with two consumers, a SIGTERM
to the parent drains both, and a child that dies ends the group with its code
(docs/operations.md, "More than one worker per GPU")."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from batchfleet import Client
from batchfleet.bench.procstat import children
from batchfleet.connectors.heartbeats import HeartbeatProbe
from batchfleet.group_health import EXIT_UNRESPONSIVE, INTERVAL_S, answers
from batchfleet.schemas.names import Names
from batchfleet.worker_group import child_args, group_exit_code

pytestmark = pytest.mark.e2e

_NAMESPACE = "group"


def _start(redis_url: str, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = (tmp_path / "group.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "batchfleet", "worker", "--broker", redis_url, "--device",
         "cpu", "--model", "demo-mlp", "--namespace", _NAMESPACE, "--worker-id", "gw",
         "--log-format", "json", "--grace-s", "10", "--processes", "2", *extra],
        stdout=log, stderr=subprocess.STDOUT)


def _wait_ready(redis_url: str, parent: subprocess.Popen[bytes], tmp_path: Path) -> None:
    probe = HeartbeatProbe(redis_url, Names(_NAMESPACE))
    try:
        deadline = time.monotonic() + 120
        while not all(probe.present(w) for w in ("gw-1", "gw-2")):
            assert parent.poll() is None, (tmp_path / "group.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the group's workers never became ready"
            time.sleep(0.1)
    finally:
        probe.close()


def _two_free_ports() -> int:
    """A port P with P + 1 free too (the group's processes take P and P + 1)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no two free ports in a row")


def _children(parent: subprocess.Popen[bytes]) -> list[int]:
    """The group's processes in the order they started (PIDs rise)."""
    return sorted(children(parent.pid))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    return state == "Z"  # exited, not yet reaped by a parent that is itself gone


def test_two_processes_serve_as_two_consumers_and_sigterm_drains_both(
        redis_url: str, tmp_path: Path) -> None:
    parent = _start(redis_url, tmp_path)
    try:
        _wait_ready(redis_url, parent, tmp_path)
        pids = _children(parent)
        assert len(pids) == 2
        with Client(redis_url, namespace=_NAMESPACE) as client:
            ids = client.submit_many("demo-mlp", [[0.1] * 10] * 300)
            results = client.wait_many(ids, 60)
        assert [r.status for r in results] == ["succeeded"] * 300
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(60) == 0, (tmp_path / "group.log").read_text()[-3000:]
        assert all(_gone(pid) for pid in pids)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_child_that_dies_stops_the_group_with_its_code(redis_url: str,
                                                         tmp_path: Path) -> None:
    parent = _start(redis_url, tmp_path)
    try:
        _wait_ready(redis_url, parent, tmp_path)
        first, second = _children(parent)
        os.kill(first, signal.SIGKILL)
        assert parent.wait(60) == 128 + signal.SIGKILL  # as a shell reports the child
        assert _gone(second)  # drained and stopped, not left running
        log = (tmp_path / "group.log").read_text()
        assert "worker process 1 of 2 was killed by SIGKILL; stopping the others" in log
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_each_child_gets_its_own_consumer_name_and_port() -> None:
    assert child_args(0, "gw", 9100) == ["--processes", "1", "--worker-id", "gw-1",
                                         "--metrics-port", "9100"]
    assert child_args(2, "gw", 9100)[-1] == "9102"
    assert child_args(1, "gw", 0)[-1] == "0"  # any free port, each its own
    assert "--metrics-port" not in child_args(1, "gw", None)


def test_the_group_exits_with_the_worst_code_when_stopped_and_never_zero_when_not() -> None:
    assert group_exit_code(0, [0, 0], stopping=True) == 0
    assert group_exit_code(0, [1], stopping=True) == 1
    assert group_exit_code(0, [-15], stopping=True) == 143  # one ended by a second SIGTERM
    assert group_exit_code(-9, [0], stopping=False) == 137
    assert group_exit_code(2, [0], stopping=False) == 2  # a start-up error's code passes on
    assert group_exit_code(0, [0], stopping=False) == 1  # a worker never exits unasked


def test_a_start_up_error_ends_the_group_with_its_code(redis_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "batchfleet", "worker", "--broker", redis_url, "--device",
         "cpu", "--model", "bad=nosuchmod:build", "--namespace", _NAMESPACE,
         "--processes", "2"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr  # a setting is wrong, as for one worker
    assert "cannot import nosuchmod:build" in proc.stderr
    assert "of 2 exited with code 2; stopping the others" in proc.stderr


def test_a_process_that_stops_answering_healthz_stops_the_group(redis_url: str,
                                                                tmp_path: Path) -> None:
    """The orchestrator's probe reaches only the first process's port: the parent watches
    the rest. A process frozen (SIGSTOP: its loop turns no more, as behind a blocking
    call) is found by its misses, the group stops with 75, and the frozen one, which
    cannot drain, is killed past --grace-s plus the margin."""
    port = _two_free_ports()
    parent = _start(redis_url, tmp_path, "--metrics-port", str(port), "--grace-s", "1")
    try:
        _wait_ready(redis_url, parent, tmp_path)
        deadline = time.monotonic() + 60
        while not all(answers("127.0.0.1", p, 2.0) for p in (port, port + 1)):
            assert time.monotonic() < deadline, "the processes never answered /healthz"
            time.sleep(0.2)
        # the parent counts misses only for a process it has seen answer (one that never
        # did is starting): let one round of its checks pass before freezing one
        time.sleep(INTERVAL_S + 2)
        first, second = _children(parent)
        os.kill(second, signal.SIGSTOP)
        assert parent.wait(90) == EXIT_UNRESPONSIVE, (tmp_path / "group.log").read_text()[-3000:]
        assert _gone(first) and _gone(second)
        log = (tmp_path / "group.log").read_text()
        assert (f"worker process 2 of 2 stopped answering /healthz on port {port + 1} "
                f"(3 checks in a row); stopping the group") in log
        assert "worker process 2 of 2 did not stop within 16 s; killing it" in log
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
