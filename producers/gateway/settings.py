"""Gateway settings: one frozen dataclass, built by the CLI (which reads the environment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.producers.gateway.auth import KeyRing
from batchfleet.schemas.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    broker: str
    results: str | None = None
    namespace: str = "bf"
    keys: KeyRing = field(default_factory=KeyRing)
    callback_policy: CallbackPolicy = field(default_factory=CallbackPolicy)
    #: Request bodies larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = 1024 * 1024
    #: Most requests in one batch submit.
    max_batch_items: int = 1000
    #: Longest long-poll (``?wait=``); longer waits are cut to this.
    max_wait_s: float = 60.0
    result_ttl_s: int = DEFAULT_TTL_S
    #: HMAC key for request IDs derived from Idempotency-Key; the same on every replica.
    #: None: a random one per process (idempotency then holds only within that process).
    id_secret: str | None = None
    #: Admission marks (producers/admission.py): refuse submits with 503 past this fraction
    #: of Redis maxmemory (0: never), or while a lane holds this many requests (0: no limit).
    admit_max_memory: float = 0.8
    admit_max_backlog: int = 0
    #: How long the list of served models is trusted before it is read again.
    model_list_ttl_s: float = 5.0
    #: Each Redis pool's size (the gateway has two); past it, callers wait for a connection.
    #: Long-polls hold none while they wait, so this bounds Redis calls in flight, not
    #: open HTTP requests (docs/http-api.md, "Connection pools").
    redis_max_connections: int = 256

    def validated(self) -> GatewaySettings:
        if not self.keys.keys:
            raise ConfigError("no API keys configured: use --keys-file or BATCHFLEET_GATEWAY_KEYS "
                              "(make one with `batchfleet gateway hash-key`)")
        if self.max_body_bytes < 1 or self.max_batch_items < 1 or self.max_wait_s < 0:
            raise ConfigError("max_body_bytes and max_batch_items must be positive, "
                              "max_wait_s not negative")
        if self.redis_max_connections < 2:
            raise ConfigError("redis_max_connections must be at least 2")
        if self.id_secret is not None and len(self.id_secret) < 16:
            raise ConfigError("the ID secret must be at least 16 characters "
                              "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)")
        return self
