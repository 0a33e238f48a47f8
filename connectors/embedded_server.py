"""A server run as a child process on a free loopback port: the lifecycle both
embedded servers (Redis, the Kafka-protocol broker) share.

The process is owned by the object and stopped by ``stop()`` or the context
manager, never by ``__del__``. Its output goes to a log file in its own
temporary directory, which start-up errors quote.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from batchfleet.schemas.errors import ConfigError


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    #: What error messages call it.
    name = "server"
    start_timeout_s = 15.0

    def __init__(self, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"batchfleet-{self.name}-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    def command(self) -> list[str]:
        """The command line that starts the server on ``self.port``."""
        raise NotImplementedError

    def answers(self) -> bool:
        """True once the server serves requests."""
        raise NotImplementedError

    def start(self) -> Self:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ConfigError(f"{self.name} exited at start: {self.log_tail()}")
            if self.answers():
                return self
            time.sleep(0.02)
        self.stop()
        raise ConfigError(f"{self.name} did not answer on port {self.port} in "
                          f"{self.start_timeout_s}s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:].strip() or "(empty log)"
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def freeze(self) -> None:
        """SIGSTOP: the server hangs (a GC pause, a stalled disk) but keeps its state."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
