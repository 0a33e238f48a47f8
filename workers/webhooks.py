"""Webhook delivery from the worker's side: put one delivery job per finished request.

``ResultWriter`` calls :meth:`RQCallbackSink.enqueue` (its write hooks'
``before_write``, through the ``Webhooks`` middleware) just *before* it writes
a batch's results, so a crash in between cannot lose a webhook. That makes
duplicates possible (the batch is redelivered and completed again), so the job
ID is derived from (request ID, generation) and an existing job is never
enqueued twice (``connectors.webhook_queue``). The job reads the result the
store holds at delivery time (``connectors.webhook_jobs``), so it never needs
the result here. The queue is synchronous; one batch's enqueue is one thread hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from batchfleet.connectors.webhook_queue import RQWebhookQueue, WebhookJob
from batchfleet.schemas.names import Names
from batchfleet.workers.jobs import Answer


def _untraced(answer: Answer) -> None:
    return None


class RQCallbackSink:
    def __init__(
        self, redis_url: str, names: Names, *, retry_intervals: Sequence[int],
        job_timeout_s: int = 60, keep_s: int = 86_400,
        traceparent_of: Callable[[Answer], str | None] | None = None,
    ) -> None:
        self._traceparent_of = traceparent_of or _untraced  # tracing on: the span's parent
        self._queue = RQWebhookQueue(redis_url, names, retry_intervals=retry_intervals,
                                     job_timeout_s=job_timeout_s, keep_s=keep_s)

    async def enqueue(self, answers: Sequence[Answer]) -> None:
        jobs = [WebhookJob(a.result.request_id, a.generation, a.callback_url,
                           self._traceparent_of(a))
                for a in answers if a.callback_url]
        if jobs:
            await asyncio.to_thread(self._queue.enqueue, jobs)

    def close(self) -> None:
        self._queue.close()
