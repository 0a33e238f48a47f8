"""``memory://`` broker: lanes as in-process streams with consumer groups.

The semantics of the Redis Streams transport (``connectors.redis_streams``), in one
process: one stream per model and lane; a group hands each entry to one consumer and
keeps it pending (owner, delivery time, count) until acked, and an ack deletes it, so a
lane's length is its backlog; an entry idle past ``claim_idle_ms`` is claimed by the
next consumer that looks (``XAUTOCLAIM``), with a delivery count of 2; ``keep_alive``
resets the idle time of held entries; pause and resume are per model. Process memory
is never lost, so ``lane_losses`` stays empty, and a lane is never sharded (one stream
holds it whatever ``--lane-shards`` says).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.broker import (
    Consumer,
    Delivery,
    LaneBacklog,
    OutboundMessage,
    Publisher,
    ShardSource,
)
from batchfleet.connectors.memory_state import Group, MemoryState, Pending, Stream, memory_state
from batchfleet.connectors.values import StorePressure
from batchfleet.schemas.names import LANES, Names

if TYPE_CHECKING:  # mypy checks that the memory broker and its parts are what doors expect
    from batchfleet.connectors.broker import Broker, LaneLossDetection, LanePressure, ShardedLanes


class MemoryPublisher:
    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def publish(self, messages: Sequence[OutboundMessage]) -> None:
        if not messages:
            return
        with self._state.lock:
            for msg in messages:
                stream = self._state.streams.setdefault((msg.model, msg.lane), Stream())
                stream.entries[self._state.next_id()] = msg.payload
        self._state.stream_wakeup.notify()

    async def pressure(self, lanes: Sequence[tuple[str, str]],
                       shards: Mapping[str, int] | None = None) -> StorePressure:
        """No memory limit; the depth of each (model, lane) asked about (admission)."""
        with self._state.lock:
            depths = {lane: len(self._state.streams[lane].entries)
                      if lane in self._state.streams else 0 for lane in lanes}
        return StorePressure(0, 0, "noeviction", depths)

    async def close(self) -> None:
        return None


class MemoryConsumer:
    """One named consumer of the namespace's group."""

    def __init__(self, state: MemoryState, group: str, consumer_name: str, *,
                 claim_idle_ms: int = 60_000, claim_interval_s: float | None = None) -> None:
        self._state = state
        self._group = group
        self._consumer = consumer_name
        self._claim_idle_s = claim_idle_ms / 1000.0
        self._claim_interval_s = claim_interval_s if claim_interval_s is not None else min(
            5.0, claim_idle_ms / 2000.0)
        self._next_claim = 0.0
        self._lanes: list[tuple[str, str]] = []
        self._paused: set[str] = set()
        #: Lanes recreated after a loss: never, in process memory (the seam's shape).
        self.lane_losses: dict[str, int] = {}

    async def start(self, models: Sequence[str]) -> None:
        """Create the group on every lane at its start (idempotent, like BUSYGROUP)."""
        with self._state.lock:
            for model in models:
                for lane in LANES:
                    stream = self._state.streams.setdefault((model, lane), Stream())
                    stream.groups.setdefault(self._group, Group())
                    if (model, lane) not in self._lanes:
                        self._lanes.append((model, lane))

    async def use_shards(self, own: Mapping[str, int], source: ShardSource | None = None
                         ) -> None:
        """Accepted and ignored: one in-process stream holds a lane at any K."""
        return None

    def _live(self) -> list[tuple[str, str]]:
        lanes = [lane for lane in self._lanes
                 if lane[0].partition("@")[0] not in self._paused]
        return sorted(lanes, key=lambda lane: LANES.index(lane[1]))

    def _take(self, max_count: int) -> list[Delivery]:
        """Claims due (idle orphans, interactive lanes first), then new entries; locked."""
        now = time.monotonic()
        out: list[Delivery] = []
        if now >= self._next_claim:
            self._next_claim = now + self._claim_interval_s
            for lane in self._live():
                stream = self._state.streams[lane]
                group = stream.groups[self._group]
                for key, p in list(group.pending.items()):
                    if len(out) >= max_count:
                        break
                    if now - p.delivered_at < self._claim_idle_s:
                        continue
                    if key not in stream.entries:  # deleted while pending: just ack it
                        del group.pending[key]
                        continue
                    p.consumer, p.delivered_at, p.count = self._consumer, now, p.count + 1
                    out.append(Delivery(lane[0], lane[1], stream.entries[key], (lane, key),
                                        delivery_count=2))
        for lane in self._live():
            if len(out) >= max_count:
                break
            stream = self._state.streams[lane]
            group = stream.groups[self._group]
            for key, payload in stream.entries.items():
                if len(out) >= max_count:
                    break
                if key <= group.last:
                    continue
                group.last = key
                group.pending[key] = Pending(self._consumer, now)
                out.append(Delivery(lane[0], lane[1], payload, (lane, key), delivery_count=1))
        return out

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self._state.stream_wakeup.version
            with self._state.lock:
                out = self._take(max_count)
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            await self._state.stream_wakeup.wait(
                seen, min(left, max(0.0, self._next_claim - time.monotonic()) or left))

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Ack and delete, atomically (never acked-but-not-deleted)."""
        with self._state.lock:
            for d in deliveries:
                lane, key = d.token
                stream = self._state.streams.get(lane)
                if stream is None:
                    continue
                stream.groups.get(self._group, Group()).pending.pop(key, None)
                stream.entries.pop(key, None)

    async def keep_alive(self, deliveries: Sequence[Delivery]) -> None:
        """Reset the idle time of held entries (claim to ourselves, count unchanged)."""
        now = time.monotonic()
        with self._state.lock:
            for d in deliveries:
                lane, key = d.token
                stream = self._state.streams.get(lane)
                group = stream.groups.get(self._group) if stream else None
                p = group.pending.get(key) if group else None
                if p is not None:
                    p.consumer, p.delivered_at = self._consumer, now

    async def pause(self, models: Sequence[str] | None = None) -> None:
        self._paused.update(models if models is not None else {m for m, _ in self._lanes})

    async def resume(self, models: Sequence[str] | None = None) -> None:
        if models is None:
            self._paused.clear()
        else:
            self._paused.difference_update(models)
        self._state.stream_wakeup.notify()

    async def backlog(self) -> list[LaneBacklog]:
        now_ms = time.time() * 1000.0
        out: list[LaneBacklog] = []
        with self._state.lock:
            for model, lane in self._lanes:
                entries = self._state.streams[(model, lane)].entries
                first = next(iter(entries), None)
                age = max(0.0, (now_ms - first[0]) / 1000.0) if first else 0.0
                out.append(LaneBacklog(model, lane, len(entries), age))
        return out

    async def close(self) -> None:
        return None


@dataclass(slots=True)
class MemoryBroker:
    """A ``Broker``: publishers and consumers over one in-process store and namespace."""

    url: str
    state: MemoryState
    names: Names
    claim_idle_ms: int = 60_000

    def publisher(self, **_: Any) -> Publisher:
        return MemoryPublisher(self.state)

    def consumer(self, consumer_name: str, *, claim_idle_ms: int | None = None,
                 **_: Any) -> Consumer:
        return MemoryConsumer(self.state, self.names.consumer_group, consumer_name,
                              claim_idle_ms=claim_idle_ms or self.claim_idle_ms)

    def shard_source(self) -> ShardSource | None:
        """Memory lanes are never sharded: no source to read."""
        return None

    async def close(self) -> None:
        return None


def open_memory_broker(url: str, *, namespace: str = "bf", names: Names | None = None,
                       claim_idle_ms: int = 60_000, **_: Any) -> MemoryBroker:
    """The broker of ``memory://NAME``: options the doors pass and memory does not need
    (partitions, session timeout, connection limit, lane shards) are accepted and ignored."""
    names = names or Names(namespace)
    return MemoryBroker(url.strip(), memory_state(url, names.prefix), names, claim_idle_ms)


if TYPE_CHECKING:
    def _is_a_broker(broker: MemoryBroker) -> Broker:
        return broker

    def _capabilities(consumer: MemoryConsumer, publisher: MemoryPublisher
                      ) -> tuple[ShardedLanes, LaneLossDetection, LanePressure]:
        return consumer, consumer, publisher
