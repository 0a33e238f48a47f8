"""A real Redis Cluster on loopback: 3 primaries and 3 replicas, for the ``cluster`` tests.

Six ``redis-server --cluster-enabled yes`` processes on free ports, joined with
``redis-cli --cluster create --cluster-replicas 1``. A short node timeout (2 s) makes
a replica take over a killed primary within a few seconds (the failover test).

:meth:`RedisClusterServers.start` returns only once every replica has finished its first
sync with its primary. A replica that never synced refuses to take over ("Disconnected
from master for longer than allowed", ``cluster-replica-validity-factor``), so a primary
killed before that leaves its slots unserved for good and the cluster in ``fail``: that,
not the client, is what made the failover test hang. Diskless sync without its default
5 s delay keeps the wait short.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

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


class RedisClusterServers:
    """Six nodes; ``url`` names every seed, ``kill_primary_of`` SIGKILLs one primary."""

    def __init__(self, nodes: int = 6) -> None:
        self.ports = [cluster_port() for _ in range(nodes)]
        self._dir = Path(tempfile.mkdtemp(prefix="bf-cluster-"))
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                              text=True, timeout=10, check=False).stdout

    def start(self) -> Self:
        for port in self.ports:
            node_dir = self._dir / str(port)
            node_dir.mkdir()
            self._procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no",
                 "--save", "", "--repl-diskless-sync-delay", "0",
                 "--dir", str(node_dir), "--logfile", "redis.log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in self.ports:
            self._wait(lambda p=port: self._cli(p, "ping").strip() == "PONG", "node up")
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

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        slot = int(self._cli(self.live_ports[0], "cluster", "keyslot", key).strip())
        for line in self._cli(self.live_ports[0], "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" not in parts[2] or "fail" in parts[2]:
                continue
            for span in parts[8:]:
                lo, _, hi = span.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return int(parts[1].split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"no primary serves slot {slot}")

    def kill(self, port: int) -> None:
        proc = self._procs[port]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_promoted(self, killed: int, timeout_s: float = 30.0) -> None:
        """Until a replica has taken over the killed primary's slots (cluster ok again)."""
        def promoted() -> bool:
            nodes = self._cli(self.live_ports[0], "cluster", "nodes")
            return (f":{killed}@" in nodes and "fail" in nodes.split(f":{killed}@")[1]
                    .split("\n")[0]) and all(
                "cluster_state:ok" in self._cli(p, "cluster", "info") for p in self.live_ports)
        self._wait(promoted, "replica promoted", timeout_s)

    def _wait(self, check: object, what: str, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if callable(check) and check():
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
