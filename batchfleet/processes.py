"""Starting ``batchfleet worker`` as a child process and knowing when it is ready.

The demo, the benchmark and the end-to-end tests all run workers this way, so
a worker is measured and tested exactly as it runs in production. Readiness is
the worker's heartbeat key, which it writes only after warm-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from batchfleet.connectors.heartbeats import HeartbeatProbe
from batchfleet.schemas.errors import BatchfleetError, ConfigError
from batchfleet.schemas.names import DEFAULT_NAMESPACE, Names


class WorkerProcess:
    def __init__(
        self,
        broker: str,
        results: str | None = None,
        *,
        models: tuple[str, ...] = ("demo-mlp",),
        extra_args: tuple[str, ...] = (),
        namespace: str = DEFAULT_NAMESPACE,
        env: dict[str, str] | None = None,
        log_level: str = "info",
        keep_log: bool = True,
        device: str = "cpu",
    ) -> None:
        """``device``: the worker's ``--device``; cpu unless asked (tests and the demo must
        not depend on a GPU being there; the bench passes ``auto``, the worker's default)."""
        self.worker_id = f"w-{uuid.uuid4().hex[:8]}"
        self.broker = broker
        self.results = results or broker
        self.namespace = namespace
        self.log_path = Path(tempfile.mkstemp(prefix=f"batchfleet-{self.worker_id}-",
                                              suffix=".log")[1])
        self.args = [sys.executable, "-m", "batchfleet", "worker", "--broker", broker,
                     "--worker-id", self.worker_id, "--namespace", namespace,
                     "--log-format", "json", "--log-level", log_level, "--device", device]
        if results:
            self.args += ["--results", results]
        for model in models:
            self.args += ["--model", model]
        self.args += list(extra_args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        #: False: the log file is removed when the worker exits cleanly (the benchmark
        #: starts dozens); a worker that failed keeps it, for its tail.
        self.keep_log = keep_log

    def start(self) -> WorkerProcess:
        """Start the worker process (once: a second start would leak the first)."""
        if self.proc is not None:
            raise ConfigError(f"worker {self.worker_id} was already started")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env)
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> WorkerProcess:
        """Block until the worker's heartbeat appears (it is warmed up and consuming)."""
        probe = HeartbeatProbe(self.results, Names(self.namespace))
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise ConfigError(f"worker exited with {self.proc.returncode} during start-up:"
                                      f"\n{self.log_tail()}")
                try:
                    if probe.present(self.worker_id):
                        return self
                except BatchfleetError:  # the store is still starting: keep waiting
                    pass
                time.sleep(0.05)
        finally:
            probe.close()
        raise ConfigError(f"worker not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait for the graceful drain; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to ack or clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> WorkerProcess:
        """Starts the worker unless ``start()`` already did; stops it on exit."""
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        code = self.terminate()
        if not self.keep_log and exc_type is None and code == 0:
            self.log_path.unlink(missing_ok=True)
