"""The Redis counters ``bench --capacity`` reads: on one server, or on every cluster node.

Why per node: ``INFO commandstats`` and the net byte counters belong to one server. On
a Redis Cluster each request-path command runs on the primary that holds its key's
slot, so a run resets and reads every node, sums the primaries for the model's totals
and keeps each primary's own counts (how evenly the requests land). Replicas only
apply the replication stream. Redis 7 counts that traffic apart
(``total_net_repl_input/output_bytes``), so the sums leave it out and it is reported
on its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.asyncio as aioredis

from batchfleet.connectors.redis_client import cluster_nodes, is_cluster_url, redis_client

#: What :meth:`Meter.read` reads besides commands: client bytes in and out, replication
#: bytes in and out, Redis CPU (µs since the last reset).
METERS = ("net_in", "net_out", "repl_in", "repl_out", "cpu_us")

Counts = dict[str, int]


@dataclass(frozen=True, slots=True)
class Node:
    label: str  # host:port
    client: aioredis.Redis
    primary: bool


async def _counters(r: aioredis.Redis) -> Counts:
    """Calls per command, bytes and cumulative CPU of one server."""
    stats = await r.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    net = await r.info("stats")
    # Redis 7's total_net_* include the replication link; the clients' bytes are the rest.
    out["repl_in"], out["repl_out"] = (int(net.get("total_net_repl_input_bytes", 0)),
                                       int(net.get("total_net_repl_output_bytes", 0)))
    out["net_in"] = int(net["total_net_input_bytes"]) - out["repl_in"]
    out["net_out"] = int(net["total_net_output_bytes"]) - out["repl_out"]
    out["cpu_us"] = await _cpu_us(r)
    return out


async def _cpu_us(r: aioredis.Redis) -> int:
    """Redis's own CPU, networking included (cumulative: only differences mean anything).
    Not commandstats' usec: a script's time is counted again under each inner command."""
    cpu = await r.info("cpu")
    return int((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6)


def summed(per_node: dict[str, Counts], labels: list[str]) -> Counts:
    """Counts added up over ``labels`` (the primaries)."""
    out: Counts = {}
    for label in labels:
        for name, v in per_node[label].items():
            out[name] = out.get(name, 0) + v
    return out


class Meter:
    """Every node of the Redis a run is measured on, and a keyed client for the rest.

    ``slots`` maps slot ranges to their primary's label (empty on one server)."""

    def __init__(self, url: str, nodes: list[Node], slots: list[tuple[int, int, str]]
                 ) -> None:
        self.url = url
        self.nodes = nodes
        self.slots = slots
        #: Routed by key (a ``RedisCluster`` on a cluster): the run's own reads and deletes.
        self.keyed = redis_client(url)
        self._cpu: dict[str, int] = {}

    @property
    def cluster(self) -> bool:
        return bool(self.slots)

    @property
    def primaries(self) -> list[str]:
        return [n.label for n in self.nodes if n.primary]

    @property
    def replicas(self) -> list[str]:
        return [n.label for n in self.nodes if not n.primary]

    def node_of_slot(self, slot: int) -> str:
        for lo, hi, label in self.slots:
            if lo <= slot <= hi:
                return label
        return self.primaries[0]

    async def warm(self) -> None:
        """Open the keyed client: a cluster client's first command reads the slot map and
        the ``COMMAND`` table (about 100 KB out), which must not land in a counted window."""
        await self.keyed.exists("bench-capacity-warm")

    async def reset(self) -> None:
        """``CONFIG RESETSTAT`` everywhere; CPU (which it does not reset) is noted."""
        await asyncio.gather(*(n.client.config_resetstat() for n in self.nodes))
        self._cpu = {n.label: c for n, c in zip(
            self.nodes, await asyncio.gather(*(_cpu_us(n.client) for n in self.nodes)),
            strict=True)}

    async def read(self) -> dict[str, Counts]:
        """Each node's counts since the last :meth:`reset`."""
        found = await asyncio.gather(*(_counters(n.client) for n in self.nodes))
        for n, counts in zip(self.nodes, found, strict=True):
            counts["cpu_us"] -= self._cpu.get(n.label, 0)
        return {n.label: c for n, c in zip(self.nodes, found, strict=True)}

    async def used_memory(self) -> int:
        """The memory ``maxmemory`` counts, summed over the primaries: ``used_memory``
        less ``mem_not_counted_for_evict`` (the replication backlog and the replicas'
        output buffers, which grow with a run's writes up to their caps, not with the
        data it keeps)."""
        infos = await asyncio.gather(*(n.client.info("memory") for n in self.nodes
                                       if n.primary))
        return sum(int(i["used_memory"]) - int(i.get("mem_not_counted_for_evict", 0))
                   for i in infos)

    async def pending_entries(self, stream: str) -> int:
        """Entries delivered and not yet acked, over the stream's groups."""
        return sum(int(g["pending"]) for g in await self.keyed.xinfo_groups(stream))

    async def streams(self, pattern: str) -> list[str]:
        """The stream keys matching ``pattern`` on every primary, sorted."""
        found: list[str] = []
        for n in self.nodes:
            if n.primary:
                found += [k.decode() if isinstance(k, bytes) else str(k) async for k in
                          n.client.scan_iter(match=pattern, _type="STREAM")]
        return sorted(found)

    async def memory_usage(self, key: str) -> int:
        return int(await self.keyed.memory_usage(key) or 0)

    async def unlink(self, keys: list[str]) -> None:
        """``UNLINK`` (a cluster client splits it per slot)."""
        await self.keyed.unlink(*keys)

    async def close(self) -> None:
        await self.keyed.aclose()
        for n in self.nodes:
            await n.client.aclose()


async def open_meter(url: str) -> Meter:
    """The nodes behind ``url``: one server, or a cluster's primaries (with their slot
    ranges) and replicas as ``CLUSTER NODES`` lists them, read from the first seed that
    answers. Not ``CLUSTER SLOTS``: it omits replicas until they have synced."""
    if not is_cluster_url(url):
        client = aioredis.Redis.from_url(url)
        kwargs = client.connection_pool.connection_kwargs
        label = f"{kwargs.get('host', 'unix')}:{kwargs.get('port', kwargs.get('path', ''))}"
        meter = Meter(url, [Node(label, client, True)], [])
        await meter.warm()
        return meter
    seeds, user, password = cluster_nodes(url)
    text = ""
    for host, port in seeds:
        seed = aioredis.Redis(host=host, port=port, username=user, password=password)
        try:
            reply = await seed.execute_command(  # type: ignore[no-untyped-call]
                "CLUSTER", "NODES")
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            break
        except (OSError, aioredis.RedisError):
            continue
        finally:
            await seed.aclose()
    slots: list[tuple[int, int, str]] = []
    roles: dict[str, bool] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8 or "fail" in parts[2] or "noaddr" in parts[2]:
            continue
        label = parts[1].split("@")[0]
        roles[label] = "master" in parts[2]
        for span in parts[8:]:
            lo, _, hi = span.partition("-")
            if lo.isdigit():
                slots.append((int(lo), int(hi or lo), label))
    if not slots:
        raise ConnectionError(f"no seed of {url} answered CLUSTER NODES with its slots")
    nodes = [Node(label, aioredis.Redis(host=label.rsplit(":", 1)[0],
                                        port=int(label.rsplit(":", 1)[1]),
                                        username=user, password=password), primary)
             for label, primary in sorted(roles.items(), key=lambda kv: (not kv[1], kv[0]))]
    meter = Meter(url, nodes, sorted(slots))
    await meter.warm()
    return meter
