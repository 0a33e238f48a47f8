"""``batchfleet worker`` starting badly and stopping whatever its stderr is: as a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from batchfleet.processes import WorkerProcess

pytestmark = pytest.mark.e2e


def _worker_args(redis_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "batchfleet", "worker", "--broker", redis_url,
            "--device", "cpu", "--log-format", "json", "--namespace", "life", *extra]


def test_a_taken_metrics_port_is_one_line_and_no_ready(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # where the worker binds by default
        taken.listen()
        port = taken.getsockname()[1]
        proc = _run(_worker_args(redis_url, "--metrics-port", str(port)))
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Traceback" not in output and "worker ready" not in output, output
    assert proc.stderr.strip().splitlines() == [
        f"error: --metrics-port {port}: cannot listen on 0.0.0.0:{port}: "
        "address already in use"], output


def test_a_bad_log_level_is_one_line(redis_url: str) -> None:
    proc = _run(_worker_args(redis_url, "--log-level", "verbose"))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --log-level 'verbose': expected one of debug, info, warning, error, critical"]


def test_an_unreachable_store_is_one_line_unless_debug(redis_url: str) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    proc = _run(_worker_args(dead))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "worker ready" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: result store {dead} is not answering"]
    debug = _run(_worker_args(dead), BATCHFLEET_DEBUG="1")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_sigterm_ends_a_worker_whose_logs_go_to_a_closed_pipe(redis_url: str) -> None:
    grace_s = 5.0
    worker = WorkerProcess(redis_url, namespace="life-pipe",
                           extra_args=("--grace-s", str(grace_s)))
    # batchfleet worker 2>&1 | head -1: the reader goes away after the first line
    head = subprocess.Popen(["head", "-1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert head.stdin is not None
    proc = subprocess.Popen(worker.args, stdout=head.stdin, stderr=subprocess.STDOUT,
                            env=_env())
    head.stdin.close()
    try:
        head.wait(timeout=60)  # it read one line and left: the pipe is closed now
        worker.proc = proc
        worker.wait_ready(timeout_s=120)
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        proc.wait(timeout=grace_s + 5)
        assert time.monotonic() - start < grace_s + 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_during_start_up_with_a_wedged_model_ends_within_grace(redis_url: str) -> None:
    """Warm-up runs a forward that never returns: SIGTERM still ends the process in time."""
    grace_s = 3.0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = _worker_args(redis_url, "--grace-s", str(grace_s), "--metrics-port", str(port),
                        "--model", "sleepy=tests.support.models:sleepy_model")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env())
    try:
        _wait_listening(port, proc)  # start-up has begun: the health port binds first
        time.sleep(1)  # now inside the warm-up forward (120 s)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=grace_s + 15)  # a liveness bound, not a speed test
        assert "worker ready" not in out, out
        assert "stopped during start-up" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"worker never listened on {port} (exit {proc.poll()})")


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=120,
                          env={**_env(), **env})


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "BATCHFLEET_DEBUG"}


def test_log_lines_never_block_or_raise_on_a_full_or_closed_pipe() -> None:
    from batchfleet.workers.logs import QuietOnBrokenPipe

    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as stream:
        logger = QuietOnBrokenPipe(stream, max_lines=100)
        start = time.monotonic()
        for _ in range(5_000):  # 100 queued lines alone are 3x a pipe's buffer; nobody reads
            logger.msg("x" * 2_000)
        assert time.monotonic() - start < 5.0 and logger.dropped > 0
        os.close(read_fd)  # the reader goes away: the blocked write fails, then all drop
        logger.flush(timeout_s=10.0)
        assert logger.broken
        logger.msg("after")  # still no exception
