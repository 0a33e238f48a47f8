"""Webhook delivery from the worker's side: put one RQ job per finished request.

``ResultWriter`` calls :meth:`RQCallbackSink.enqueue` just *before* it writes
a batch's results, so a crash in between cannot lose a webhook. That makes
duplicates possible (the batch is redelivered and completed again), so the job
ID is derived from (request ID, generation) and an existing job is never
enqueued twice. The job reads the result the store holds at delivery time
(``connectors.webhook_jobs``), so it never needs the result here. RQ is
synchronous; one batch's enqueue is one thread hop and two round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis
from redis.exceptions import RedisError
from rq import Queue, Retry
from rq.job import Job

from connectors.webhook_jobs import JOB_FUNC
from schemas.errors import ResultStoreError
from schemas.names import Names
from workers.intake import Answer


class RQCallbackSink:
    def __init__(
        self, redis_url: str, names: Names, *, retry_intervals: Sequence[int],
        job_timeout_s: int = 60, keep_s: int = 86_400,
    ) -> None:
        self._conn = redis.Redis.from_url(redis_url)
        self._names = names
        self._queue = Queue(names.webhook_queue, connection=self._conn)
        #: One backoff interval per retry: RQ aligns the list from its end.
        self._intervals = [int(i) for i in retry_intervals]
        self._job_timeout_s = job_timeout_s
        #: Finished and failed jobs are kept this long, and with them the dedupe.
        self._keep_s = keep_s

    async def enqueue(self, answers: Sequence[Answer]) -> None:
        await asyncio.to_thread(self._enqueue, list(answers))

    def _enqueue(self, answers: list[Answer]) -> None:
        jobs: dict[str, Answer] = {}
        for a in answers:
            if a.callback_url:
                jobs.setdefault(self._names.webhook_job_id(a.result.request_id, a.generation), a)
        if not jobs:
            return
        try:
            with self._conn.pipeline(transaction=False) as pipe:
                for job_id in jobs:
                    pipe.exists(Job.key_for(job_id))
                exists = pipe.execute()
            retry = Retry(max=len(self._intervals), interval=self._intervals) \
                if self._intervals else None
            self._queue.enqueue_many([
                Queue.prepare_data(
                    JOB_FUNC,
                    args=(self._names.prefix, a.result.request_id, a.generation,
                          a.callback_url),
                    job_id=job_id, retry=retry, timeout=self._job_timeout_s,
                    result_ttl=self._keep_s, failure_ttl=self._keep_s,
                    description=f"webhook {a.result.request_id} -> {a.callback_url}",
                    meta={"retry_max": len(self._intervals)})
                for (job_id, a), found in zip(jobs.items(), exists, strict=True) if not found
            ])
        except RedisError as exc:
            raise ResultStoreError(f"cannot enqueue webhooks: {exc}") from exc

    def close(self) -> None:
        self._conn.close()
