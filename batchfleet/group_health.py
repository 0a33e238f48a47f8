"""The ``worker --processes N`` parent's watch on each process's ``/healthz``.

Why: an orchestrator's liveness probe reaches one port, the first process's, so a
process whose event loop stopped turning (a blocking call in a hook or a handler, a
native call that holds the interpreter lock) would go unnoticed while the group looked
alive, its lanes' requests waiting for the reclaim. ``/healthz`` is answered by the
process's own event loop (``workers.health``), so an answer means the loop turns. The
parent asks every process in turn; once one that has answered before misses
:data:`MISSES` checks in a row, the group stops as for a process that exited, with
:data:`EXIT_UNRESPONSIVE`. A process that has never answered is still starting (that
is a startup probe's business, as for one worker), so it is not counted.

Only with a fixed ``--metrics-port`` (with 0 the parent cannot know the ports).
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Sequence

#: Seconds between two rounds of checks, and how long one check may take.
INTERVAL_S = 5.0
TIMEOUT_S = 2.0
#: Checks in a row a process that answered before may miss before the group stops.
MISSES = 3
#: The group's exit code then: the one a worker uses when its compute thread stayed
#: stuck (``workers.middleware.stuck.EXIT_STUCK``, EX_TEMPFAIL: restart me).
EXIT_UNRESPONSIVE = 75

Probe = Callable[[str, int, float], bool]


def answers(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``GET /healthz`` on ``host:port`` answers 200 within ``timeout_s``."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):  # refused, reset, timed out, garbled
        return False
    finally:
        conn.close()


def probe_host(metrics_host: str) -> str:
    """Where the parent reaches a process that binds ``metrics_host``."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(metrics_host,
                                                                      metrics_host)


class HealthWatch:
    """Which process, if any, has stopped answering: call :meth:`check` often; it probes
    at most every ``interval_s``."""

    def __init__(self, host: str, ports: Sequence[int], probe: Probe = answers,
                 interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S,
                 misses: int = MISSES) -> None:
        self._host, self._ports, self._probe = host, list(ports), probe
        self._interval_s, self._timeout_s, self._misses = interval_s, timeout_s, misses
        self._answered = [False] * len(self._ports)
        self.missed = [0] * len(self._ports)
        self._next = 0.0

    def check(self, now: float) -> int | None:
        """The index of a process that answered before and has now missed ``misses``
        checks in a row; None while every one answers (or is still starting)."""
        if now < self._next:
            return None
        self._next = now + self._interval_s
        for i, port in enumerate(self._ports):
            if self._probe(self._host, port, self._timeout_s):
                self._answered[i], self.missed[i] = True, 0
            elif self._answered[i]:
                self.missed[i] += 1
                if self.missed[i] >= self._misses:
                    return i
        return None
