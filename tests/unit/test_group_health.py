"""The ``--processes`` parent's health watch: which process it calls unresponsive, and
when, against a scripted probe; and the probe itself against real sockets (one that
answers, one refused, one that accepts and never answers)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from batchfleet.group_health import HealthWatch, answers, probe_host

pytestmark = pytest.mark.unit


class Script:
    """Answers per port, changed by the test between rounds; counts the checks."""

    def __init__(self, up: dict[int, bool]) -> None:
        self.up, self.checks = up, 0

    def __call__(self, host: str, port: int, timeout_s: float) -> bool:
        self.checks += 1
        return self.up[port]


def test_a_process_that_answered_is_reported_after_three_misses_in_a_row() -> None:
    script = Script({9100: True, 9101: True})
    watch = HealthWatch("127.0.0.1", [9100, 9101], script, interval_s=5.0)
    assert watch.check(0.0) is None
    script.up[9101] = False
    assert [watch.check(t) for t in (5.0, 10.0)] == [None, None]
    assert watch.check(15.0) == 1
    assert watch.missed == [0, 3]


def test_an_answer_between_misses_starts_the_count_again() -> None:
    script = Script({9100: True})
    watch = HealthWatch("127.0.0.1", [9100], script, interval_s=1.0)
    rounds = [True, False, False, True, False, False]
    found = []
    for t, up in enumerate(rounds):
        script.up[9100] = up
        found.append(watch.check(float(t)))
    assert found == [None] * 6 and watch.missed == [2]


def test_a_process_that_never_answered_is_starting_not_unresponsive() -> None:
    script = Script({9100: True, 9101: False})
    watch = HealthWatch("127.0.0.1", [9100, 9101], script, interval_s=1.0)
    assert [watch.check(float(t)) for t in range(20)] == [None] * 20
    assert watch.missed == [0, 0]


def test_checks_run_at_most_once_per_interval() -> None:
    script = Script({9100: True, 9101: True})
    watch = HealthWatch("127.0.0.1", [9100, 9101], script, interval_s=5.0)
    for t in (0.0, 0.1, 2.0, 4.9, 5.0, 9.0):
        watch.check(t)
    assert script.checks == 4  # two rounds (at 0 and 5) of two ports


def test_the_probe_host_for_a_wildcard_bind_is_loopback() -> None:
    assert probe_host("0.0.0.0") == "127.0.0.1"
    assert probe_host("::") == "::1"
    assert probe_host("10.0.0.7") == "10.0.0.7"


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def healthz_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_probe_on_real_sockets(healthz_port: int) -> None:
    assert answers("127.0.0.1", healthz_port, 2.0)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = closed.getsockname()[1]
    closed.close()
    assert not answers("127.0.0.1", refused, 2.0)
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        assert not answers("127.0.0.1", silent.getsockname()[1], 0.3)
