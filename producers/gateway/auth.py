"""API keys for the gateway: stored hashed, each with an allowlist of models.

Keys are configured when the gateway starts, one per line
``KEY_ID:SHA256HEX:MODEL1,MODEL2[:OPTIONS]`` (``*`` allows every model), from
``--keys-file`` or ``BATCHFLEET_GATEWAY_KEYS``. OPTIONS, space-separated
``name=value``, are ``scopes=admin`` (read every key's results), ``rate=R``
requests per second with ``burst=B``, and ``in_flight=N`` (see
connectors/quotas.py). Only the SHA-256 of a key is kept, so the
configuration is not a secret worth stealing; a presented key is hashed and
compared with every entry in constant time. ``batchfleet gateway hash-key``
makes a new key and its line.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from dataclasses import dataclass, field

from batchfleet.connectors.quotas import Quota
from batchfleet.schemas.errors import AuthError, ConfigError

_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
SCOPES = frozenset({"admin"})
_OPTIONS = ("scopes", "rate", "burst", "in_flight")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return "bfk_" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    digest: str
    models: frozenset[str]
    scopes: frozenset[str] = frozenset()
    quota: Quota = field(default_factory=Quota)

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    def allows(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    def may_read(self, owner: str | None) -> bool:
        """Its own requests; every request (ownerless ones too) with the admin scope."""
        return self.admin or (owner is not None and owner == self.key_id)

    def check_model(self, model: str) -> None:
        if not self.allows(model):
            raise AuthError(f"API key {self.key_id!r} may not use model {model!r}",
                            forbidden=True)

    def line(self) -> str:
        options = []
        if self.scopes:
            options.append(f"scopes={','.join(sorted(self.scopes))}")
        q = self.quota
        if q.rate_per_s:
            options += [f"rate={q.rate_per_s:g}", f"burst={q.bucket}"]
        if q.max_in_flight:
            options.append(f"in_flight={q.max_in_flight}")
        line = f"{self.key_id}:{self.digest}:{','.join(sorted(self.models))}"
        return line + (":" + " ".join(options) if options else "")


@dataclass(frozen=True, slots=True)
class KeyRing:
    keys: tuple[ApiKey, ...] = ()

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """Lines (or ``;``-separated entries) of ``KEY_ID:SHA256HEX:MODELS[:OPTIONS]``;
        ``#`` comments."""
        keys: list[ApiKey] = []
        for number, raw in enumerate(text.replace(";", "\n").splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(":")
            if len(parts) not in (3, 4):
                raise ConfigError(f"API key entry {number}: expected "
                                  "KEY_ID:SHA256HEX:MODELS[:OPTIONS]")
            key_id, digest, models = (p.strip() for p in parts[:3])
            if not _KEY_ID.match(key_id):
                raise ConfigError(f"API key entry {number}: bad key id {key_id!r}")
            if not _HEX64.match(digest.lower()):
                raise ConfigError(f"API key entry {number}: the hash must be 64 hex characters "
                                  "(sha256; see `batchfleet gateway hash-key`)")
            allowed = frozenset(m.strip() for m in models.split(",") if m.strip())
            if not allowed:
                raise ConfigError(f"API key entry {number}: no models allowed")
            scopes, quota = _options(parts[3] if len(parts) == 4 else "", number)
            keys.append(ApiKey(key_id, digest.lower(), allowed, scopes, quota))
        if len({k.key_id for k in keys}) != len(keys):
            raise ConfigError("API key ids must be unique")
        return cls(tuple(keys))

    def authenticate(self, presented: str | None) -> ApiKey:
        """The key whose hash matches, checked against every entry in constant time."""
        if not presented:
            raise AuthError("missing API key: send it in the X-API-Key header")
        digest = hash_key(presented)
        found: ApiKey | None = None
        for key in self.keys:
            if hmac.compare_digest(key.digest, digest):
                found = key
        if found is None:
            raise AuthError("invalid API key")
        return found


def _options(text: str, number: int) -> tuple[frozenset[str], Quota]:
    """``scopes=admin rate=50 burst=100 in_flight=20``: all optional, 0 = unlimited."""
    values: dict[str, str] = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or name not in _OPTIONS or name in values:
            raise ConfigError(f"API key entry {number}: bad option {item!r} "
                              f"(expected name=value, names: {', '.join(_OPTIONS)})")
        values[name] = value
    scopes = frozenset(s for s in values.get("scopes", "").split(",") if s)
    if scopes - SCOPES:
        raise ConfigError(f"API key entry {number}: unknown scope(s) "
                          f"{', '.join(sorted(scopes - SCOPES))} (known: admin)")
    try:
        rate = float(values.get("rate", 0))
        burst, in_flight = int(values.get("burst", 0)), int(values.get("in_flight", 0))
    except ValueError as exc:
        raise ConfigError(f"API key entry {number}: {exc}") from None
    if not math.isfinite(rate) or rate < 0 or burst < 0 or in_flight < 0:
        raise ConfigError(f"API key entry {number}: rate, burst and in_flight must be >= 0")
    if burst and not rate:
        raise ConfigError(f"API key entry {number}: burst needs a rate")
    return scopes, Quota(rate, burst, in_flight)
