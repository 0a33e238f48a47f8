"""Signing in to the console: an admin API key, exchanged once for a session cookie, and
a CSRF token for the actions.

The cookie is ``KEY_ID.EXPIRES.MAC``, the MAC over the key's ID, its *current* hash and
the expiry, under a secret made when the process starts. Each request checks it against
the key ring as it is now (``KeySource`` re-reads the keys file when it changes), so a
key removed or rotated ends its sessions at once, and a restart ends them all. The CSRF
token is a MAC of the cookie: the page reads it from ``GET api/session`` and sends it in
the ``X-CSRF-Token`` header; a cross-site form can send the cookie but not the header.
Pure apart from the clock and the file stat.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from batchfleet.producers.gateway.auth import ApiKey, KeyRing
from batchfleet.schemas.errors import AuthError, ConfigError

log = structlog.get_logger("batchfleet.console")
#: ``KeySource._seen`` while the file cannot be read: the next good read parses it again.
_BROKEN = (-1.0, -1)

COOKIE = "batchfleet_console"
CSRF_HEADER = "X-CSRF-Token"
#: How long a session lasts; signing in again makes a new one.
SESSION_S = 12 * 3600
#: Who acts when the console is open on loopback without keys.
LOCAL = "local"


class KeySource:
    """The key ring from a keys file (and ``BATCHFLEET_GATEWAY_KEYS`` text), parsed again
    whenever the file's modification time or size changes; or a fixed ring (the
    gateway's, when it mounts the console)."""

    def __init__(self, path: str | None = None, text: str = "",
                 fixed: KeyRing | None = None) -> None:
        self._path, self._text, self._fixed = path, text, fixed
        self._seen: tuple[float, int] | None = None
        self._ring = fixed or KeyRing.parse(text)

    def ring(self) -> KeyRing:
        """The ring as the file says now. A file that is gone or does not parse (caught
        half-written) keeps the last good ring, logged once per change, so sign-ins
        still get a 401 or 403 that means something, never a 500."""
        if self._fixed is not None or self._path is None:
            return self._ring
        try:
            stat = os.stat(self._path)
            seen = (stat.st_mtime, stat.st_size)
            if seen != self._seen:
                self._seen = seen
                self._ring = KeyRing.parse(self._text + "\n" + Path(self._path).read_text())
        except (OSError, ValueError, ConfigError) as exc:
            if self._seen != _BROKEN:
                self._seen = _BROKEN
                log.warning("console keys file unreadable; keeping the keys read before",
                            path=self._path, error=str(exc))
        return self._ring


@dataclass(frozen=True, slots=True)
class Session:
    who: str
    cookie: str
    #: Signed in by an ``X-API-Key`` header (a script): no cookie, so no CSRF to fear.
    by_header: bool = False


class Sessions:
    def __init__(self, keys: KeySource | None, secret: bytes | None = None) -> None:
        """``keys`` None: open (loopback, no keys file); everyone acts as ``local``."""
        self._keys = keys
        self._secret = secret or secrets.token_bytes(32)

    @property
    def open(self) -> bool:
        return self._keys is None

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._secret, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    def _admin(self, key: ApiKey) -> ApiKey:
        if not key.admin:
            raise AuthError(f"API key {key.key_id!r} may not use the console: that needs an "
                            "admin-scoped key (scopes=admin)", forbidden=True)
        return key

    def sign_in(self, presented: str | None, now: float | None = None) -> Session:
        """A new session for an admin key (or the local one when open)."""
        if self._keys is None:
            who, digest = LOCAL, ""
        else:
            key = self._admin(self._keys.ring().authenticate(presented))
            who, digest = key.key_id, key.digest
        expires = str(int((now or time.time()) + SESSION_S))
        return Session(who, f"{who}.{expires}.{self._mac(who, digest, expires)}")

    def check(self, cookie: str | None, api_key: str | None = None,
              now: float | None = None) -> Session:
        """The session a request carries: its cookie, else an ``X-API-Key`` (scripts).
        AuthError (401) when neither is valid now."""
        if api_key and self._keys is not None:  # open: a header proves nothing, no skip
            return Session(self.sign_in(api_key, now).who, "", by_header=True)
        who, _, rest = (cookie or "").partition(".")
        expires, _, mac = rest.partition(".")
        fresh = bool(who) and expires.isdigit() and int(expires) >= (now or time.time())
        if self._keys is None:  # open: reads need nothing, actions the local cookie
            valid = fresh and who == LOCAL and hmac.compare_digest(
                mac, self._mac(LOCAL, "", expires))
            return Session(LOCAL, (cookie or "") if valid else "")
        if not fresh:
            raise AuthError("sign in with an admin API key")
        key = next((k for k in self._keys.ring().keys if k.key_id == who), None)
        if key is None or not key.admin or not hmac.compare_digest(
                mac, self._mac(who, key.digest, expires)):
            raise AuthError("the session is no longer valid: sign in again")
        return Session(who, cookie or "")

    def csrf(self, session: Session) -> str:
        return self._mac("csrf", session.cookie)

    def check_csrf(self, session: Session, token: str | None) -> None:
        if session.by_header:
            return
        if not session.cookie or not token or not hmac.compare_digest(token, self.csrf(session)):
            raise AuthError(f"missing or wrong {CSRF_HEADER}: reload the page", forbidden=True)
