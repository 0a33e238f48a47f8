"""Worker settings: one frozen dataclass, built once at the entry point.

Nothing below the CLI reads the environment; the CLI maps ``BATCHFLEET_*``
variables and flags onto this object and hands it down.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from connectors.result_store import DEFAULT_TTL_S
from connectors.urls import BrokerURL, results_url_for
from schemas.errors import ConfigError


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    broker: BrokerURL
    results_url: str
    models: tuple[str, ...] = ("demo-mlp",)
    device: str = "auto"
    #: A batch closes at this many requests...
    max_batch_size: int = 64
    #: ...or when its oldest request has waited this long.
    max_wait_ms: float = 5.0
    #: How many batches' worth of requests may wait in memory ahead of compute.
    prefetch_batches: int = 2
    fetch_timeout_ms: int = 100
    #: Pending entries idle this long belong to a crashed consumer and are reclaimed.
    claim_idle_ms: int = 60_000
    result_ttl_s: int = DEFAULT_TTL_S
    #: On SIGTERM, in-flight work gets this long to finish before the worker exits anyway.
    grace_s: float = 30.0
    namespace: str = "bf"
    kafka_partitions: int = 4
    #: A dead Kafka member's partitions move after this long (and Tansu holds joins for half).
    kafka_session_timeout_ms: int = 10_000
    max_message_bytes: int = 16 * 1024 * 1024
    #: Result writes in flight at once; beyond that compute waits (backpressure).
    max_pending_writes: int = 4
    #: Retries: attempts in all (1 = no retry), full-jitter backoff base and cap.
    max_attempts: int = 3
    retry_base_s: float = 0.5
    retry_cap_s: float = 30.0
    #: Per-model overrides, model -> "ATTEMPTS[:BASE_S[:CAP_S]]".
    retry_overrides: tuple[tuple[str, str], ...] = ()
    #: A request redelivered after its worker died is a suspect and runs alone; after this
    #: many solo runs that also died, it is quarantined to the DLQ instead of run again.
    quarantine_after: int = 3
    #: A batch computing longer than this fails (retryably); None: no limit.
    compute_timeout_s: float | None = None
    #: Circuit breakers: trip after this many failures in a row, probe after the cooldown.
    breaker_failures: int = 5
    breaker_cooldown_s: float = 5.0
    #: Serve /metrics, /healthz and /readyz here (None: off; 0: any free port).
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    #: How often backlog, DLQ size and breaker gauges are refreshed.
    sample_every_s: float = 5.0
    worker_id: str = field(default_factory=default_worker_id)
    #: Enqueue a webhook delivery (RQ) for every terminal result with a callback_url.
    webhooks: bool = True
    #: Redis holding the RQ webhook queue; None: the result store's.
    webhook_redis_url: str | None = None
    #: Seconds between delivery attempts, one per retry (RQ aligns the list from its end).
    webhook_retry_intervals: tuple[int, ...] = (5, 30, 120, 600, 1800, 3600, 3600)

    @classmethod
    def from_url(cls, broker: str, results: str | None = None, **overrides: Any) -> WorkerSettings:
        parsed = BrokerURL.parse(broker)
        settings = cls(broker=parsed, results_url=results_url_for(parsed, results))
        return settings.replace(**overrides) if overrides else settings.validated()

    def replace(self, **changes: Any) -> WorkerSettings:
        return replace(self, **changes).validated()

    def validated(self) -> WorkerSettings:
        if self.max_batch_size < 1:
            raise ConfigError("max_batch_size must be at least 1")
        if self.max_wait_ms < 0:
            raise ConfigError("max_wait_ms must not be negative")
        if self.prefetch_batches < 1:
            raise ConfigError("prefetch_batches must be at least 1")
        if self.grace_s <= 0:
            raise ConfigError("grace_s must be positive")
        if not self.models:
            raise ConfigError("at least one --model is needed")
        if self.max_attempts < 1 or self.quarantine_after < 1 or self.breaker_failures < 1:
            raise ConfigError("max_attempts, quarantine_after and breaker_failures must be >= 1")
        if any(i < 0 for i in self.webhook_retry_intervals):
            raise ConfigError("webhook_retry_intervals must not be negative")
        if self.compute_timeout_s is not None and self.compute_timeout_s <= 0:
            raise ConfigError("compute_timeout_s must be positive")
        return self
