"""Running a job so that SIGTERM stops it the way Ctrl-C does.

Kubernetes (and systemd, and ``timeout``) stop a process with SIGTERM, whose
default action ends it on the spot: no final checkpoint, and a progress bar that
hid the terminal cursor leaves it hidden. Here SIGTERM cancels the job's task
instead, exactly as ``asyncio.run`` does for SIGINT, so the job's own clean-up
runs (a forced checkpoint, files closed, the bar stopped and the cursor shown),
then :class:`Stopped` names the signal so the entry point exits 128 + its number.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from batchfleet.producers.bulk.errors import BulkError

T = TypeVar("T")

#: How often a swallowed SIGTERM cancel is issued again (see ``insist``).
RECANCEL_S = 0.25


class Stopped(BulkError):
    """The run was stopped by a signal after saving its progress."""

    wire_type = "bulk_stopped"

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``; SIGTERM cancels it and raises :class:`Stopped` once it has
    wound down. SIGINT keeps asyncio's behaviour: ``KeyboardInterrupt`` after the same."""
    received: list[int] = []

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            if not received:  # a second SIGTERM must not cut the clean-up short
                received.append(signal.SIGTERM)
                task.cancel()
                loop.call_later(RECANCEL_S, insist)

        def insist() -> None:
            """Cancel again while the first request was swallowed: a timeout that expired
            as the cancel arrived can take it for its own and ``uncancel()`` it (Python
            3.11's ``asyncio.timeout``/``wait_for``), and the job then ran to its end.
            While the clean-up runs the request is still pending (``cancelling() > 0``),
            so this never cuts the clean-up short."""
            if task.done():
                return
            if task.cancelling() == 0:
                task.cancel()
            loop.call_later(RECANCEL_S, insist)

        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        if received:
            raise Stopped(received[0]) from None
        raise
    if received:  # the job wound down on its own terms, but it was still told to stop
        raise Stopped(received[0])
    return result
