"""Console settings: frozen dataclasses, built by the CLI (which reads the environment).

Declared once, here, like the gateway's (``producers/gateway/settings.py``): the
``batchfleet console`` options, their variables, ``--help`` and ``--print-config`` come
from these fields. ``keys`` is read from ``--keys-file`` (the gateway's format) again
whenever the file changes, so a removed key stops working without a restart.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.settings import (
    BROKER,
    DEFAULT_NAMESPACE,
    NAMESPACE,
    RESULTS,
    opt,
    with_opt,
)

_ENV = "BATCHFLEET_CONSOLE_"


def _port(value: str) -> int:
    port = int(value) if value.strip().isdigit() else 0
    if not 1 <= port <= 65535:
        raise ValueError("expected a port from 1 to 65535")
    return port


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address: only this machine can reach it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    broker: str = field(metadata=with_opt(BROKER, panel="Connection"))
    results: str | None = field(default=None, metadata=with_opt(RESULTS, panel="Connection"))
    namespace: str = field(default=DEFAULT_NAMESPACE,
                           metadata=with_opt(NAMESPACE, panel="Connection"))
    host: str = field(default="127.0.0.1", metadata=opt(
        "Address to listen on. Off loopback, every request needs an admin key from "
        "--keys-file (exchanged for a session cookie).", env=_ENV + "HOST"))
    port: int = field(default=8090, metadata=opt(
        "Port to listen on.", env=_ENV + "PORT", parse=_port, metavar="<int>"))
    keys_file: str | None = field(default=None, metadata=opt(
        "The gateway's API keys file (--keys-file of `batchfleet gateway`); only "
        "admin-scoped keys may sign in. Re-read when it changes.",
        env=_ENV + "KEYS_FILE", metavar="PATH"))
    refresh_s: float = field(default=2.0, metadata=opt(
        "Seconds between a page's refreshes (at least 1).", env=_ENV + "REFRESH_S"))
    log_level: str = field(default="info", metadata=opt(
        "critical, error, warning, info, debug or trace (uvicorn's levels).",
        env="BATCHFLEET_LOG_LEVEL"))

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def open_without_key(self) -> bool:
        """On loopback with no keys file, the page opens without signing in."""
        return self.loopback and self.keys_file is None

    def validated(self) -> ConsoleSettings:
        if self.refresh_s < 1:
            raise ConfigError("--refresh-s must be at least 1 (a page polls at most once a "
                              "second)")
        if not self.loopback and self.keys_file is None:
            raise ConfigError(f"--host {self.host} is off loopback: give --keys-file with an "
                              "admin-scoped key (`batchfleet gateway hash-key --scopes admin`)")
        return self
