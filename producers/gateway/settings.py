"""Gateway settings: frozen dataclasses, built by the CLI (which reads the environment).

Each field is declared once, here, with its default and an ``opt()`` (``schemas/settings.py``):
the ``batchfleet gateway`` options, their ``BATCHFLEET_*`` variables, ``--help`` and
``--print-config`` are generated from these declarations (``cli_gateway.py``). Fields
marked ``internal`` are built by code (the key ring, the callback policy), not flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.producers.gateway.auth import KeyRing
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.settings import (
    BROKER,
    CALLBACK_ALLOW_NETS,
    CALLBACK_HOSTS,
    CALLBACK_SCHEMES,
    DEFAULT_CALLBACK_SCHEMES,
    DEFAULT_NAMESPACE,
    NAMESPACE,
    RESULTS,
    opt,
    with_opt,
)

_ENV = "BATCHFLEET_GATEWAY_"


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    broker: str = field(metadata=with_opt(BROKER, panel="Connection"))
    results: str | None = field(default=None, metadata=with_opt(RESULTS, panel="Connection"))
    namespace: str = field(default=DEFAULT_NAMESPACE,
                           metadata=with_opt(NAMESPACE, panel="Connection"))
    keys: KeyRing = field(default_factory=KeyRing, metadata=opt(
        "From --keys-file and BATCHFLEET_GATEWAY_KEYS.", internal=True))
    callback_policy: CallbackPolicy = field(default_factory=CallbackPolicy, metadata=opt(
        "From the --callback-* options.", internal=True))
    #: Request bodies larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = field(default=1024 * 1024, metadata=opt(
        "Larger bodies get 413.", env=_ENV + "MAX_BODY_BYTES"))
    #: Most requests in one batch submit.
    max_batch_items: int = field(default=1000, metadata=opt(
        "Most requests per batch.", env=_ENV + "MAX_BATCH_ITEMS"))
    #: Longest long-poll (``?wait=``); longer waits are cut to this.
    max_wait_s: float = field(default=60.0, metadata=opt(
        "Longest long-poll.", env=_ENV + "MAX_WAIT_S"))
    result_ttl_s: int = field(default=DEFAULT_TTL_S, metadata=opt(
        "How long results are kept.", internal=True))
    #: HMAC key for request IDs derived from Idempotency-Key; the same on every replica.
    #: None: a random one per process (idempotency then holds only within that process).
    id_secret: str | None = field(default=None, metadata=opt(
        "HMAC key for request IDs derived from Idempotency-Key; the same on every replica. "
        "Unset: random per process (idempotency does not survive restarts).",
        env=_ENV + "ID_SECRET", secret=True, show="random per process"))
    #: Each Redis pool's size (the gateway has two); past it, callers wait for a connection.
    #: Long-polls hold none while they wait, so this bounds Redis calls in flight, not
    #: open HTTP requests (docs/http-api.md, "Connection pools").
    redis_max_connections: int = field(default=256, metadata=opt(
        "Size of each Redis connection pool; past it, requests wait for a free connection.",
        env=_ENV + "REDIS_MAX_CONNECTIONS"))
    #: Admission marks (producers/admission.py): refuse submits with 503 past this fraction
    #: of Redis maxmemory (0: never), or while a lane holds this many requests (0: no limit).
    admit_max_memory: float = field(default=0.8, metadata=opt(
        "Answer 503 past this fraction of Redis maxmemory (0: never).",
        env="BATCHFLEET_ADMIT_MAX_MEMORY"))
    admit_max_backlog: int = field(default=0, metadata=opt(
        "Answer 503 while a lane holds this many requests (0: no limit).",
        env="BATCHFLEET_ADMIT_MAX_BACKLOG"))
    #: The operator console at /console/ (``producers/console``), signed in with admin keys.
    console: bool = field(default=False, metadata=opt(
        "Also serve the operator console at /console/; admin-scoped keys sign in "
        "(docs/operations.md, \"Console\").", env=_ENV + "CONSOLE"))
    #: How long the list of served models is trusted before it is read again.
    model_list_ttl_s: float = field(default=5.0, metadata=opt(
        "How long the list of served models is trusted.", internal=True))

    def validated(self, *, need_keys: bool = True) -> GatewaySettings:
        if need_keys and not self.keys.keys:
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


def _port(value: str) -> int:
    port = int(value) if value.strip().isdigit() else 0
    if not 1 <= port <= 65535:
        raise ValueError("expected a port from 1 to 65535")
    return port


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What ``batchfleet gateway`` needs besides :class:`GatewaySettings`: where it
    listens, and the raw options the key ring and the callback policy are built from."""

    host: str = field(default="127.0.0.1", metadata=opt(
        "Address to listen on; 0.0.0.0 for every interface.", env=_ENV + "HOST"))
    port: int = field(default=8080, metadata=opt(
        "Port to listen on.", env=_ENV + "PORT", parse=_port, metavar="<int>"))
    keys_file: str | None = field(default=None, metadata=opt(
        "File of API keys, one KEY_ID:SHA256HEX:MODEL1,MODEL2[:OPTIONS] per line (* = any "
        "model; OPTIONS: scopes=admin rate=R burst=B in_flight=N).",
        env=_ENV + "KEYS_FILE", metavar="PATH"))
    callback_schemes: str = field(default=DEFAULT_CALLBACK_SCHEMES,
                                  metadata=with_opt(CALLBACK_SCHEMES))
    callback_hosts: str = field(default="", metadata=with_opt(CALLBACK_HOSTS))
    callback_allow_nets: str = field(default="", metadata=with_opt(CALLBACK_ALLOW_NETS))
    log_level: str = field(default="info", metadata=opt(
        "critical, error, warning, info, debug or trace (uvicorn's levels).",
        env="BATCHFLEET_LOG_LEVEL"))
