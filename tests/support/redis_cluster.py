"""A real Redis Cluster on loopback: 3 primaries and 3 replicas, for the ``cluster`` tests.

The start-up (six ``redis-server --cluster-enabled yes`` processes on free ports, joined
with ``redis-cli --cluster create --cluster-replicas 1``) is
``batchfleet.bench.cluster_servers``, which ``bench --capacity --cluster`` uses too.
This adds what the failover test needs. A short node timeout (2 s) makes a replica
take over a killed primary within a few seconds; ``start`` returns only once every
replica has finished its first sync (see ``ClusterServers.wait_replicated``).
"""

from __future__ import annotations

import os
import signal

from batchfleet.bench.cluster_servers import ClusterServers, cluster_port

__all__ = ["NODE_TIMEOUT_MS", "RedisClusterServers", "cluster_port"]

NODE_TIMEOUT_MS = 2000


class RedisClusterServers(ClusterServers):
    """Six nodes; ``url`` names every seed, ``kill_primary_of`` SIGKILLs one primary."""

    def __init__(self, nodes: int = 6) -> None:
        super().__init__(nodes, node_timeout_ms=NODE_TIMEOUT_MS)

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
