"""Waiting for threads a test started to exit (other tests' may live on: the hang and
containment tests abandon some on purpose)."""

from __future__ import annotations

import threading
import time


def threads_gone(prefix: str, before: set[threading.Thread], within_s: float) -> bool:
    """Whether every thread whose name starts with ``prefix`` and that was not in ``before``
    has exited within ``within_s``."""
    deadline = time.monotonic() + within_s
    while any(t.name.startswith(prefix) and t not in before for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
