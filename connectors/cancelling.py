"""Stopping tasks on Python 3.11, where one ``cancel()`` is not always enough.

``asyncio.wait_for`` drops a cancellation that lands as the call it wraps finishes
(fixed in 3.12). Our Redis connections no longer send under it
(``connectors.redis_connection``) and our own bounded waits use :func:`bounded`
instead, but aiokafka still uses it, so a task that must be gone before its owner goes
on (a worker's side loops, a client's listener, a bulk job's feeder) is cancelled until
it is done. A bulk feeder that dropped its one cancel waited for ever for a slot the
stopped writer would never free; a worker's side loop that dropped it ran on after the
worker stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: How long a cancelled task gets before it is cancelled again.
RECANCEL_S = 0.5


async def bounded(work: Awaitable[T], timeout_s: float | None) -> T:
    """``asyncio.wait_for(work, timeout_s)`` that keeps a cancel landing as ``work``
    finishes (3.11's drops it), and makes no task or waiter per call: the worker waits
    this way several times a batch. ``TimeoutError`` past ``timeout_s``; None: no bound."""
    async with asyncio.timeout(timeout_s):
        return await work


async def cancel_until_done(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that is still running;
    their results and errors are theirs (retrieved here, never raised)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    await asyncio.gather(*tasks, return_exceptions=True)
