"""API keys for the gateway: stored hashed, each with an allowlist of models.

Keys are configured when the gateway starts, one per line
``KEY_ID:SHA256HEX:MODEL1,MODEL2`` (``*`` allows every model), from
``--keys-file`` or ``BATCHFLEET_GATEWAY_KEYS``. Only the SHA-256 of a key is
kept, so the configuration is not a secret worth stealing; a presented key is
hashed and compared with every entry in constant time. ``batchfleet gateway
hash-key`` makes a new key and its line.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from schemas.errors import AuthError, ConfigError

_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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

    def allows(self, model: str) -> bool:
        return "*" in self.models or model in self.models

    def check_model(self, model: str) -> None:
        if not self.allows(model):
            raise AuthError(f"API key {self.key_id!r} may not use model {model!r}",
                            forbidden=True)

    def line(self) -> str:
        return f"{self.key_id}:{self.digest}:{','.join(sorted(self.models))}"


@dataclass(frozen=True, slots=True)
class KeyRing:
    keys: tuple[ApiKey, ...] = ()

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """Lines (or ``;``-separated entries) of ``KEY_ID:SHA256HEX:MODELS``; ``#`` comments."""
        keys: list[ApiKey] = []
        for number, raw in enumerate(text.replace(";", "\n").splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(":")
            if len(parts) != 3:
                raise ConfigError(f"API key entry {number}: expected KEY_ID:SHA256HEX:MODELS")
            key_id, digest, models = (p.strip() for p in parts)
            if not _KEY_ID.match(key_id):
                raise ConfigError(f"API key entry {number}: bad key id {key_id!r}")
            if not _HEX64.match(digest.lower()):
                raise ConfigError(f"API key entry {number}: the hash must be 64 hex characters "
                                  "(sha256; see `batchfleet gateway hash-key`)")
            allowed = frozenset(m.strip() for m in models.split(",") if m.strip())
            if not allowed:
                raise ConfigError(f"API key entry {number}: no models allowed")
            keys.append(ApiKey(key_id, digest.lower(), allowed))
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
