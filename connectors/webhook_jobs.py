"""The webhook delivery job RQ runs, and the signature scheme it signs with.

The job carries only *where* and *which* (namespace, request ID, generation,
callback URL), never the result. At delivery it reads the result the store
holds for that request, so a duplicate enqueue, or a worker whose write lost
the first-result-wins race, can never send a second or a wrong result:

* record ``pending`` (the worker enqueues just *before* it writes): raise, RQ
  retries after the next backoff interval;
* record from a newer generation (a DLQ replay happened): nothing to send, that
  generation has its own job;
* record gone (expired), or a URL the SSRF policy refuses: fail for good, no
  retries left, so it lands in RQ's failed registry at once;
* otherwise POST the signed JSON; any non-2xx or network error raises and RQ
  retries with ``Retry(max=N, interval=[...])``.

This module stays light on purpose (no torch, no workers, no producers): RQ
imports it by dotted path in every webhook worker.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.tracing import delivery_span
from batchfleet.schemas.envelopes import Result, decode_result
from batchfleet.schemas.errors import (
    BatchfleetError,
    CallbackRefusedError,
    ConfigError,
    WebhookDeliveryError,
)
from batchfleet.schemas.json_form import result_json_bytes
from batchfleet.schemas.names import Names
from batchfleet.schemas.settings import (
    CALLBACK_ALLOW_NETS,
    CALLBACK_HOSTS,
    CALLBACK_SCHEMES,
    DEFAULT_WEBHOOK_TIMEOUT_S,
    WEBHOOK_SECRET,
    WEBHOOK_TIMEOUT_S,
    build,
    opt,
    setting_options,
    with_opt,
)

#: Where RQ finds the job function.
JOB_FUNC = "batchfleet.connectors.webhook_jobs.deliver_webhook"
SIGNATURE_HEADER = "Batchfleet-Signature"
DELIVERY_HEADER = "Batchfleet-Delivery"
REQUEST_ID_HEADER = "Batchfleet-Request-Id"
USER_AGENT = "batchfleet-webhooks/1"


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def signature_header(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """``t=TIMESTAMP,v1=HEX``: HMAC-SHA256 over ``b"{timestamp}." + body``.

    The timestamp is signed too, so a captured delivery cannot be replayed later
    with a fresh timestamp; receivers reject old ones (see producers.signatures).
    """
    mac = hmac.new(_key(secret), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclass(frozen=True, slots=True)
class DeliveryConfig:
    """What a webhook worker needs that must not travel in the (pickled) job: the secret.

    Declared once (``schemas/settings.py``): ``batchfleet webhooks worker`` takes its
    ``--secret`` and ``--timeout-s`` from the same declarations, and :meth:`from_env` reads the
    same variables for a plain ``rq worker``."""

    secret: str = field(metadata=with_opt(WEBHOOK_SECRET))
    policy: CallbackPolicy = field(default_factory=CallbackPolicy, metadata=opt(
        "From the --callback-* options.", internal=True))
    timeout_s: float = field(default=DEFAULT_WEBHOOK_TIMEOUT_S,
                             metadata=with_opt(WEBHOOK_TIMEOUT_S))
    #: How long a delivery waits for a still-pending result before leaving it to a retry.
    pending_grace_s: float = field(default=2.0, metadata=opt(
        "How long a delivery waits for a pending result.", internal=True))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DeliveryConfig:
        """The settings from these variables (their names: the fields' declarations)."""
        values = {o.name: o.parse(environ[o.env])
                  for o in setting_options(DeliveryConfig) if environ.get(o.env)}
        if not values.get("secret"):
            raise ConfigError(f"{WEBHOOK_SECRET.env} is not set: webhooks are never sent "
                              "unsigned")
        policy = CallbackPolicy.parse(environ.get(CALLBACK_SCHEMES.env),
                                      environ.get(CALLBACK_HOSTS.env),
                                      environ.get(CALLBACK_ALLOW_NETS.env))
        return build(cls, values, policy=policy)  # type: ignore[no-any-return]


_configured: list[DeliveryConfig] = []


def configure(config: DeliveryConfig) -> None:
    """Set by ``batchfleet webhooks worker`` before it forks work horses (they inherit it)."""
    _configured[:] = [config]


def current_config() -> DeliveryConfig:
    """The configured settings, or, under a plain ``rq worker``, the environment: the job
    is then its own entry point, so this is the one place it reads ``BATCHFLEET_*``."""
    return _configured[0] if _configured else DeliveryConfig.from_env(os.environ)


class _GiveUp(WebhookDeliveryError):
    """A delivery that no retry can fix."""

    retryable = False


def deliver_webhook(namespace: str, request_id: str, generation: int,
                    callback_url: str) -> dict[str, Any]:
    """The RQ job: POST one request generation's stored terminal result, signed."""
    from rq import get_current_job

    job = get_current_job()
    if job is None:
        raise RuntimeError("deliver_webhook runs inside an RQ job")
    try:
        with delivery_span(job.meta.get("traceparent"), request_id, callback_url):
            return deliver(job.connection, current_config(), Names(namespace), request_id,
                           generation, callback_url, job.id)
    except (_GiveUp, CallbackRefusedError, ConfigError):
        job.retries_left = 0  # RQ reads this when it handles the failure: no retry
        raise


def delivery_worker(queue: Any, name: str) -> Any:
    """An RQ worker for ``queue`` that logs a failed delivery as one line.

    A refused callback URL or a receiver that answers 500 is an expected outcome with a
    clear message; RQ's default is the whole traceback per attempt (25 lines), which
    buries the one line that matters. Anything else keeps RQ's full traceback.
    """
    from rq import Worker
    from rq.job_lifecycle import call_exception_handlers

    class DeliveryWorker(Worker):
        def handle_exception(self, job: Any, *exc_info: Any) -> None:
            exc = exc_info[1]
            if not isinstance(exc, BatchfleetError):
                super().handle_exception(job, *exc_info)
                return
            message = " ".join(str(exc).split())
            self.log.error("Worker %s: job %s failed: %s: %s", self.name, job.id,
                           type(exc).__name__, message)
            call_exception_handlers(self._exc_handlers, job, *exc_info)

    return DeliveryWorker([queue], connection=queue.connection, name=name)


def _stored_result(conn: redis.Redis, names: Names, request_id: str,
                   grace_s: float) -> Result:
    """The stored result, waiting up to ``grace_s`` while it is still pending.

    The worker enqueues the job a moment *before* it writes the result, so a fast
    webhook worker often finds it pending; a short wait here saves a whole backoff
    interval of latency. Past the grace period RQ's retry takes over.
    """
    deadline = time.monotonic() + grace_s
    while True:
        body = conn.hget(names.result(request_id), "body")
        if body is None:
            raise _GiveUp(f"result of {request_id} is gone (expired?); nothing to deliver")
        result = decode_result(bytes(body))  # type: ignore[arg-type]
        if result.is_terminal or time.monotonic() >= deadline:
            return result
        time.sleep(0.05)


def deliver(conn: redis.Redis, config: DeliveryConfig, names: Names, request_id: str,
            generation: int, callback_url: str, delivery_id: str) -> dict[str, Any]:
    """Read the stored result and POST it; raises WebhookDeliveryError to be retried."""
    result = _stored_result(conn, names, request_id, config.pending_grace_s)
    if result.generation > generation:
        return {"skipped": f"superseded by generation {result.generation}"}
    if not result.is_terminal:
        raise WebhookDeliveryError(f"result of {request_id} is not written yet")
    config.policy.check_resolved(callback_url)
    payload = result_json_bytes(result)  # the very bytes GET /v1/requests/{id} answers
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(config.secret, payload, int(time.time())),
        DELIVERY_HEADER: delivery_id,
        REQUEST_ID_HEADER: request_id,
    }
    try:
        response = httpx.post(callback_url, content=payload, headers=headers,
                              timeout=config.timeout_s, follow_redirects=False)
    except httpx.HTTPError as exc:
        raise WebhookDeliveryError(f"POST {callback_url} failed: {exc!r}") from exc
    if not 200 <= response.status_code < 300:
        raise WebhookDeliveryError(f"POST {callback_url} answered {response.status_code}")
    return {"status_code": response.status_code, "delivery_id": delivery_id}


__all__ = [
    "DELIVERY_HEADER",
    "JOB_FUNC",
    "REQUEST_ID_HEADER",
    "SIGNATURE_HEADER",
    "DeliveryConfig",
    "configure",
    "deliver",
    "deliver_webhook",
    "delivery_worker",
    "signature_header",
]
