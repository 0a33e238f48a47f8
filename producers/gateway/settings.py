"""Gateway settings: one frozen dataclass, built by the CLI (which reads the environment)."""

from __future__ import annotations

from dataclasses import dataclass, field

from connectors.result_store import DEFAULT_TTL_S
from connectors.ssrf import CallbackPolicy
from producers.gateway.auth import KeyRing
from schemas.errors import ConfigError


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

    def validated(self) -> GatewaySettings:
        if not self.keys.keys:
            raise ConfigError("no API keys configured: use --keys-file or BATCHFLEET_GATEWAY_KEYS "
                              "(make one with `batchfleet gateway hash-key`)")
        if self.max_body_bytes < 1 or self.max_batch_items < 1 or self.max_wait_s < 0:
            raise ConfigError("max_body_bytes and max_batch_items must be positive, "
                              "max_wait_s not negative")
        return self
