"""A throwaway Redis Cluster on loopback: 3 primaries and 3 replicas.

Six ``redis-server --cluster-enabled yes`` processes on free ports, joined with
``redis-cli --cluster create --cluster-replicas 1``. Why it lives in the package and
not in tests/: ``bench --capacity --cluster`` starts one too, and the package never
imports tests/. The test fixture (tests/support/redis_cluster.py) builds on this class
and adds the failover helpers, so there is one copy of the start-up.

:meth:`ClusterServers.start` returns only once every replica has finished its first
sync with its primary. A replica that never synced refuses to take over ("Disconnected
from master for longer than allowed", ``cluster-replica-validity-factor``), so a primary
killed before that leaves its slots unserved for good and the cluster in ``fail``.
Diskless sync without its default 5 s delay keeps the wait short. Each node logs to
``redis.log`` in its directory, removed with it at stop.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Self

from batchfleet.schemas.errors import ConfigError

#: The fixture's default: a replica takes over a killed primary within a few seconds.
NODE_TIMEOUT_MS = 2000


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    while True:
        port = random.randint(20000, 50000)
        if _bindable(port) and _bindable(port + 10000):
            return port


class ClusterServers:
    """``nodes`` nodes with one replica per primary; ``url`` names every seed."""

    def __init__(self, nodes: int = 6, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        self.ports = [cluster_port() for _ in range(nodes)]
        self.node_timeout_ms = node_timeout_ms
        self._dir = Path(tempfile.mkdtemp(prefix="bf-cluster-"))
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                              text=True, timeout=10, check=False).stdout

    def _pong(self, port: int) -> bool:
        return self._cli(port, "ping").strip() == "PONG"

    def start(self) -> Self:
        missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
        if missing:
            raise ConfigError(f"a Redis Cluster needs {' and '.join(missing)} on PATH "
                              "(apt-get install redis-server)")
        for port in self.ports:
            node_dir = self._dir / str(port)
            node_dir.mkdir()
            self._procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", str(self.node_timeout_ms), "--appendonly", "no",
                 "--save", "", "--repl-diskless-sync-delay", "0",
                 "--dir", str(node_dir), "--logfile", "redis.log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in self.ports:
            self._wait(partial(self._pong, port), "node up")
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       capture_output=True, timeout=60, check=True)
        self.wait_ok()
        self.wait_replicated()
        return self

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and sees every slot served."""
        def ok() -> bool:
            return all("cluster_state:ok" in self._cli(p, "cluster", "info")
                       for p in self.live_ports)
        self._wait(ok, "cluster_state:ok", timeout_s)

    def wait_replicated(self, timeout_s: float = 30.0) -> None:
        """Until every live replica's link to its primary is up (first sync done)."""
        def synced() -> bool:
            infos = [self._cli(p, "info", "replication") for p in self.live_ports]
            return all("master_link_status:up" in info
                       for info in infos if "role:slave" in info)
        self._wait(synced, "replicas synced", timeout_s)

    @property
    def live_ports(self) -> list[int]:
        return [p for p, proc in self._procs.items() if proc.poll() is None]

    def primaries(self) -> list[int]:
        return [p for p in self.live_ports
                if "role:master" in self._cli(p, "info", "replication")]

    def _wait(self, check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise TimeoutError(f"Redis Cluster: timed out waiting for {what}")

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
