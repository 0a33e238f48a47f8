"""The webhook job queue (RQ on Redis): one delivery job per finished request.

Job IDs derive from (request ID, generation) and an existing job is never
enqueued twice, so a batch completed again after a crash adds no duplicate.
The job reads the stored result at delivery time (``connectors.webhook_jobs``).
RQ is synchronous: callers run :meth:`RQWebhookQueue.enqueue` in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
from rq import Queue, Retry
from rq.job import Job

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import is_cluster_url
from batchfleet.connectors.webhook_jobs import JOB_FUNC
from batchfleet.schemas.errors import ConfigError, ResultStoreError
from batchfleet.schemas.names import Names


@dataclass(frozen=True, slots=True)
class WebhookJob:
    request_id: str
    generation: int
    callback_url: str
    #: The request's W3C trace context (tracing on): the delivery span's parent.
    traceparent: str | None = None


class RQWebhookQueue:
    def __init__(
        self, redis_url: str, names: Names, *, retry_intervals: Sequence[int],
        job_timeout_s: int = 60, keep_s: int = 86_400,
    ) -> None:
        self._conn = redis.Redis.from_url(single_node(redis_url))
        self._names = names
        self._queue = Queue(names.webhook_queue, connection=self._conn)
        #: One backoff interval per retry: RQ aligns the list from its end.
        self._intervals = [int(i) for i in retry_intervals]
        self._job_timeout_s = job_timeout_s
        #: Finished and failed jobs are kept this long, and with them the dedupe.
        self._keep_s = keep_s

    def enqueue(self, items: Sequence[WebhookJob]) -> None:
        """Enqueue one job per (request ID, generation) not already queued; two round trips."""
        jobs: dict[str, WebhookJob] = {}
        for item in items:
            jobs.setdefault(self._names.webhook_job_id(item.request_id, item.generation), item)
        if not jobs:
            return
        with wrap_errors(ResultStoreError, "cannot enqueue webhooks"):
            with self._conn.pipeline(transaction=False) as pipe:
                for job_id in jobs:
                    pipe.exists(Job.key_for(job_id))
                exists = pipe.execute()
            retry = Retry(max=len(self._intervals), interval=self._intervals) \
                if self._intervals else None
            self._queue.enqueue_many([
                Queue.prepare_data(
                    JOB_FUNC,
                    args=(self._names.prefix, job.request_id, job.generation, job.callback_url),
                    job_id=job_id, retry=retry, timeout=self._job_timeout_s,
                    result_ttl=self._keep_s, failure_ttl=self._keep_s,
                    description=f"webhook {job.request_id} -> {job.callback_url}",
                    meta={"retry_max": len(self._intervals),
                          **({"traceparent": job.traceparent} if job.traceparent else {})})
                for (job_id, job), found in zip(jobs.items(), exists, strict=True) if not found
            ])

    def close(self) -> None:
        self._conn.close()


def rq_queue(redis_url: str, names: Names) -> Queue:
    """The RQ queue itself, for the ``webhooks`` CLI (RQ's own worker and registries)."""
    return Queue(names.webhook_queue, connection=redis.Redis.from_url(single_node(redis_url)))


def single_node(redis_url: str) -> str:
    """RQ does not support Redis Cluster: its queue stays on a single-node Redis."""
    if is_cluster_url(redis_url):
        raise ConfigError(
            "webhooks are not supported on Redis Cluster: RQ needs a single-node Redis; "
            "pass --webhook-redis-url redis://host:port/db (BATCHFLEET_WEBHOOK_REDIS_URL), "
            "or turn webhooks off (--no-webhooks)")
    return redis_url
