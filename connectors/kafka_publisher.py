"""Kafka publishing: topics created idempotently, whole batches sent with batching ``send()``.

Topics are created through the admin client the first time a (model, lane) is
seen, with the configured partition count; one that already exists is fine.
Sends linger a couple of milliseconds so a batch becomes a few record batches,
then all their futures are awaited together: never one ``send_and_wait`` each.
No idempotent producer or transactions (Tansu, the development broker, refuses
``InitProducerId``); ``acks="all"`` makes an acknowledged publish durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.tracing import carrier_headers
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import Names

#: Room for the worker's 16 MiB message limit plus headers. The broker's
#: ``message.max.bytes`` (1 MB by default) must be raised to match for big tensors.
MAX_REQUEST_BYTES = 16 * 1024 * 1024 + 64 * 1024


async def ensure_topics(
    bootstrap: str, topics: Iterable[str], partitions: int, replication_factor: int = 1
) -> None:
    """Create ``topics`` with ``partitions`` each; topics that already exist are fine."""
    new = [NewTopic(t, partitions, replication_factor) for t in sorted(set(topics))]
    if not new:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="batchfleet-admin")
    try:
        await admin.start()
        response = await admin.create_topics(new)
    except KafkaError as exc:
        raise TransportError(f"cannot create Kafka topics at {bootstrap}: {exc}") from exc
    finally:
        await admin.close()
    for topic, code, *_ in response.topic_errors:
        if code not in (0, TopicAlreadyExistsError.errno):
            raise TransportError(f"cannot create Kafka topic {topic!r}: {for_code(code).__name__}")


class KafkaPublisher:
    """Sends a whole batch with batching ``send()`` calls, then awaits all their futures."""

    def __init__(
        self,
        bootstrap: str,
        names: Names,
        partitions: int = 4,
        *,
        replication_factor: int = 1,
        linger_ms: int = 2,
    ) -> None:
        self._bootstrap = bootstrap
        self._names = names
        self._topic_spec = (partitions, replication_factor)
        self._linger_ms = linger_ms
        self._producer: Any = None  # made on first publish: aiokafka binds to the running loop
        self._known_topics: set[str] = set()
        self._lock = asyncio.Lock()

    async def _prepare(self, topics: Iterable[str]) -> None:
        """Start the producer and create each topic once, however many publishes race here."""
        async with self._lock:
            if missing := set(topics) - self._known_topics:
                await ensure_topics(self._bootstrap, missing, *self._topic_spec)
                self._known_topics |= missing
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._bootstrap, client_id="batchfleet-producer",
                    acks="all", enable_idempotence=False, linger_ms=self._linger_ms,
                    max_request_size=MAX_REQUEST_BYTES,
                )
                try:
                    await producer.start()
                except KafkaError as exc:
                    await producer.stop()
                    raise TransportError(f"Kafka unreachable at {self._bootstrap}: {exc}") from exc
                self._producer = producer

    async def publish(self, messages: Sequence[OutboundMessage]) -> None:
        if not messages:
            return
        topics = [self._names.topic(m.model, m.lane) for m in messages]
        if self._producer is None or not self._known_topics.issuperset(topics):
            await self._prepare(topics)
        try:
            futures = [
                await self._producer.send(topic, value=m.payload, key=m.key.encode(),
                                          headers=carrier_headers(m.traceparent))
                for topic, m in zip(topics, messages, strict=True)
            ]
        except KafkaError as exc:
            raise TransportError(f"Kafka send failed: {exc}") from exc
        results = await asyncio.gather(*futures, return_exceptions=True)
        if failed := [r for r in results if isinstance(r, BaseException)]:
            raise TransportError(
                f"Kafka did not accept {len(failed)} of {len(messages)} messages: {failed[0]}"
            ) from failed[0]

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what is still lingering
