"""Kafka publishing: topics created idempotently, whole batches sent with batching ``send()``.

Topics are created through the admin client the first time a (model, lane) is
seen, with the configured partition count; one that already exists is fine.
Sends linger a couple of milliseconds so a batch becomes a few record batches,
then all their futures are awaited together: never one ``send_and_wait`` each.
No idempotent producer or transactions (Tansu, the development broker, refuses
``InitProducerId``); ``acks="all"`` makes an acknowledged publish durable.

A broker restart (or a lost topic) must not need a producer restart: messages the
broker refused are sent again, up to ``PUBLISH_ATTEMPTS`` times, after their topics are
created again where the broker said it does not know them (a send that only timed out
re-creates its topic just when the cluster's metadata lacks it: re-creating an existing
topic resets its log on Tansu). From the second try each goes to another partition of
its topic, so one partition without a leader (or one a broker cannot write) does not
fail the publish. Nothing relies on a request's partition: the key only spreads load,
hashed here with ``zlib.crc32`` (aiokafka's default partitioner is pure Python).
A repeat that had in fact landed is a duplicate message, which the result store absorbs
(first terminal result wins).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.tracing import carrier_headers
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import Names

#: Room for the worker's 16 MiB message limit plus headers. The broker's
#: ``message.max.bytes`` (1 MB by default) must be raised to match for big tensors.
MAX_REQUEST_BYTES = 16 * 1024 * 1024 + 64 * 1024
#: Sends of one publish before its refused messages fail it; the pauses between them.
PUBLISH_ATTEMPTS = 4
RETRY_PAUSE_S = (0.2, 0.5, 1.0)
#: Bounds on topic creation and on the metadata check before re-creating a topic, so a
#: broker that stops answering fails the publish instead of holding every publish's lock.
CREATE_TIMEOUT_S = 5.0
METADATA_TIMEOUT_S = 2.0

log = structlog.get_logger("batchfleet.kafka")


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
                try:
                    await bounded(ensure_topics(
                        self._bootstrap, missing, *self._topic_spec), CREATE_TIMEOUT_S)
                except TimeoutError as exc:
                    raise TransportError(f"Kafka at {self._bootstrap} did not create topics "
                                         f"within {CREATE_TIMEOUT_S:g}s") from exc
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
        todo = [(self._names.topic(m.model, m.lane), m) for m in messages]
        if self._producer is None or not self._known_topics.issuperset(t for t, _ in todo):
            await self._prepare(t for t, _ in todo)
        for attempt in range(PUBLISH_ATTEMPTS):
            refused = await self._send(todo, attempt)
            errors = [exc for _, exc in refused]
            if not refused or attempt == PUBLISH_ATTEMPTS - 1 or all(
                    isinstance(exc, MessageSizeTooLargeError) for exc in errors):
                break
            log.warning("kafka_publish_retry", refused=len(refused), of=len(messages),
                        attempt=attempt + 1, error=str(errors[0]))
            await asyncio.sleep(RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)])
            todo = [item for item, _ in refused]
            if missing := await self._lost_topics(refused):
                # The broker lost them: create them again. Only then: on Tansu, creating
                # a topic a stray produce had recreated resets its log.
                self._known_topics -= missing
                try:
                    await self._prepare(missing)
                except TransportError as exc:
                    errors = [exc]
                    break
        if refused:
            raise TransportError(
                f"Kafka did not accept {len(refused)} of {len(messages)} messages: {errors[0]}"
            ) from errors[0]

    async def _lost_topics(
            self, refused: Sequence[tuple[tuple[str, OutboundMessage], BaseException]]
    ) -> set[str]:
        """Topics of refused messages that the broker no longer has. A send that timed out
        proves nothing (a slow broker, a partition without a leader): its topic counts only
        if the cluster's metadata lacks it, since re-creating one that exists resets its
        log on Tansu. When the metadata cannot be read, nothing is re-created."""
        unknown = {t for (t, _), exc in refused if isinstance(exc, UnknownTopicOrPartitionError)}
        unsure = {t for (t, _), exc in refused if isinstance(exc, KafkaTimeoutError)} - unknown
        if not unsure:
            return unknown
        try:
            cluster = await bounded(self._producer.client.fetch_all_metadata(),
                                             METADATA_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            log.info("kafka_topic_check_failed", error=repr(exc))
            return unknown
        return unknown | (unsure - set(cluster.topics()))

    async def _send(self, todo: Sequence[tuple[str, OutboundMessage]], attempt: int
                    ) -> list[tuple[tuple[str, OutboundMessage], BaseException]]:
        """Send every message; returns those the broker refused, with why. Each goes to
        a partition picked here by ``crc32`` of its key (C, ~0.1 us) rather than by
        aiokafka's pure-Python ``murmur2`` (~6 us a message); from the second attempt
        on, to another partition than the first attempt's."""
        sent: list[Any] = []  # a future, or the error send() itself raised
        spreads: dict[str, list[int]] = {}  # partitions per topic, looked up once per attempt
        for topic, m in todo:
            try:
                spread = spreads.get(topic)
                if spread is None:
                    spread = spreads[topic] = sorted(await self._producer.partitions_for(topic))
                key = m.key.encode()
                sent.append(await self._producer.send(
                    topic, value=m.payload, key=key,
                    partition=spread[(zlib.crc32(key) + attempt) % len(spread)],
                    headers=carrier_headers(m.traceparent)))
            except KafkaError as exc:  # no metadata for the topic in time, say
                sent.append(exc)
        results = await asyncio.gather(
            *(f for f in sent if not isinstance(f, KafkaError)), return_exceptions=True)
        landed = iter(results)
        outcome = [f if isinstance(f, KafkaError) else next(landed) for f in sent]
        return [(item, r) for item, r in zip(todo, outcome, strict=True)
                if isinstance(r, BaseException)]

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()  # flushes what is still lingering

