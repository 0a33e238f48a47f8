"""The transport interface that Redis Streams and Kafka both implement.

Workers and producers only see these Protocols, so a transport is chosen by URL
at the entry point and nothing above this layer branches on which one it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from batchfleet.connectors.values import (
    LogPosition,
    Ownership,
    StorePressure,
    SubmitState,
    TerminalWrite,
)
from batchfleet.schemas.errors import ConfigError


class OutboundMessage(NamedTuple):
    """One encoded request on its way to a model's lane. ``key`` is the request ID.

    A named tuple, not a frozen dataclass: one is built per request on the client's
    submit path, and a frozen dataclass's ``__init__`` cost 1.5 us against 0.5 us."""

    model: str
    lane: str
    key: str
    payload: bytes
    #: The request's W3C trace context, sent as a Kafka header too (tracing on).
    traceparent: str | None = None
    #: How many shard streams the model's lanes are split into (its registry record's
    #: ``lane_shards``); Redis publishes to ``shard_for(key, shards)``, Kafka ignores it
    #: (partitions already spread a topic). 1, the default, is shard 0: always consumed.
    shards: int = 1


@dataclass(slots=True)
class Delivery:
    """One message handed to a worker; ``token`` is what the transport needs to ack it."""

    model: str
    lane: str
    payload: bytes
    token: Any
    #: How many times the broker has handed this message out, where it knows: Redis
    #: does (1 for a new entry, 2+ for a reclaimed one); Kafka does not (None), and its
    #: ``position`` lets the worker find out (``workers.log_positions``).
    delivery_count: int | None = None
    position: LogPosition | None = None


@dataclass(frozen=True, slots=True)
class LaneBacklog:
    """Queue depth of one model's lane: messages not yet acked (Redis) or lag (Kafka)."""

    model: str
    lane: str
    depth: int
    #: Age of the oldest unfinished request, where the transport can tell (Redis can).
    oldest_age_s: float | None = None


class Publisher(Protocol):
    """Puts encoded requests on the broker, a whole batch per call."""

    async def publish(self, messages: Sequence[OutboundMessage]) -> None: ...

    async def close(self) -> None: ...


class Consumer(Protocol):
    """Hands a worker batches of deliveries and takes acks for whole batches.

    ``fetch`` returns within ``timeout_s`` even when nothing arrives. ``pause``
    stops pulling at the broker (the circuit breaker uses it) without leaving
    the consumer group; ``ack`` is only called once results are durable.
    """

    async def start(self, models: Sequence[str]) -> None: ...

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]: ...

    async def ack(self, deliveries: Sequence[Delivery]) -> None: ...

    async def keep_alive(self, deliveries: Sequence[Delivery]) -> None:
        """Keep held deliveries from being reclaimed by other consumers (their holder is
        alive); raises TransportError when the broker cannot be told."""
        ...

    async def pause(self, models: Sequence[str] | None = None) -> None:
        """Stop pulling these models' lanes (every lane when None); others keep flowing."""
        ...

    async def resume(self, models: Sequence[str] | None = None) -> None:
        """Pull these models' lanes again (every lane when None)."""
        ...

    async def backlog(self) -> list[LaneBacklog]: ...

    async def close(self) -> None: ...


class ShardSource(Protocol):
    """Where a consumer learns how many shard streams each lane may hold work on (the
    model registry, ``connectors.model_registry``)."""

    async def consumed_shards(self, names: Sequence[str]) -> dict[str, int]: ...


class Broker(Protocol):
    """What ``connectors.open_broker(url, **options)`` returns: the maker of one
    namespace's publishers and consumers on one broker (options in docs/architecture.md).

    The broker owns nothing shared: each publisher and consumer it makes holds its own
    connections and is closed by whoever made it."""

    #: The URL it was opened with (what status pages and errors show).
    url: str

    def publisher(self) -> Publisher: ...

    def consumer(self, consumer_name: str) -> Consumer: ...


@runtime_checkable
class ShardedLanes(Protocol):
    """A consumer whose lanes can be split into shard streams (Redis Streams)."""

    async def use_shards(self, own: Mapping[str, int], source: ShardSource | None = None
                         ) -> None: ...


@runtime_checkable
class LaneLossDetection(Protocol):
    """A consumer that notices lanes the broker lost (model lane -> when, in ms); the
    worker's heartbeat records them in the control plane and forgets them once noted."""

    lane_losses: dict[str, int]


@runtime_checkable
class LanePressure(Protocol):
    """A publisher that can read its server's memory with lane depths (one pipeline),
    which the client's admission control reads instead of the store's."""

    async def pressure(self, lanes: Sequence[tuple[str, str]],
                       shards: Mapping[str, int] | None = None) -> StorePressure: ...


class OneTrip(Protocol):
    """Records and publishes a chunk of requests in one call (``CombinedSubmit``)."""

    async def submit(self, records: Sequence[tuple[str, bytes]], owners: Sequence[Ownership],
                     messages: Sequence[OutboundMessage]) -> list[SubmitState]: ...


@runtime_checkable
class CombinedSubmit(Protocol):
    """A broker that can record requests in the control plane and publish them in one
    round trip, where the plane lives on the broker's own server (single-node Redis)."""

    def one_trip(self, plane: Any) -> OneTrip | None:
        """The one-trip submit over ``plane``, or None where it does not apply."""
        ...


class FinishTrip(Protocol):
    """Writes a batch's terminal results and acks its deliveries in one call
    (``CombinedFinish``)."""

    async def write_and_ack(self, writes: Sequence[TerminalWrite],
                            deliveries: Sequence[Delivery]) -> list[bool]:
        """The result store's ``write_terminal`` (True where this call's write won), then
        the consumer's ``ack`` of ``deliveries``, only once every write has landed."""
        ...


@runtime_checkable
class CombinedFinish(Protocol):
    """A broker whose consumer can ack inside the control plane's terminal write, where
    the plane lives on the broker's own server (single-node Redis)."""

    def one_trip_finish(self, plane: Any, consumer: Consumer) -> FinishTrip | None:
        """The one-trip finish over ``plane`` for ``consumer``, or None where it does not
        apply."""
        ...


async def shard_lanes(consumer: Consumer, own: Mapping[str, int],
                      source: ShardSource | None = None) -> None:
    """Have a started consumer read every shard stream of its lanes: ``own`` (model ->
    this worker's ``--lane-shards``) and whatever ``source`` says may still hold work,
    re-read as it goes. A transport without shard streams (Kafka: a topic is already
    split into partitions) takes only 1 and refuses more with a ConfigError."""
    if not isinstance(consumer, ShardedLanes):
        sharded = sorted(m for m, k in own.items() if k > 1)
        if sharded:
            raise ConfigError(f"--lane-shards is for Redis Streams only ({', '.join(sharded)}): "
                              "a Kafka lane scales by partitions (--kafka-partitions)")
        return
    await consumer.use_shards(own, source)
