"""Kafka topic watch: re-creating a consumer's topics that the broker lost, off the fetch path.

Asking for the cluster's topics fetches whole-cluster metadata, and re-creating a topic
takes an admin round trip: a fetch that did either could block for seconds. So a
background task started with the consumer checks every ``TOPIC_CHECK_S`` and re-creates
what is gone; the consumer's ``fetch`` only takes the re-created topics
(:meth:`TopicWatch.take`) and starts their partitions afresh, in its own task, so the
partition bookkeeping is never touched from two tasks.

A topic counts as gone only when missing at two checks in a row, not at the first: a
broker that lost its data may still serve a topic a stray produce recreated and list it
a moment later (Tansu does), and creating it then would reset its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import structlog
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.kafka_publisher import ensure_topics
from batchfleet.schemas.errors import TransportError

log = structlog.get_logger("batchfleet.kafka")
#: How often the consumer asks the broker whether its topics still exist.
TOPIC_CHECK_S = 5.0
#: Bounds on one check's metadata read and on re-creating the topics it found gone.
LIST_TIMEOUT_S = 2.0
CREATE_TIMEOUT_S = 5.0
#: Bound on the seek that starts a lost partition's new log from its beginning.
SEEK_TIMEOUT_S = 5.0


class TopicWatch:
    """Which of ``topics`` the broker lost and this watch created again."""

    def __init__(self, bootstrap: str, topics: Iterable[str], spec: tuple[int, int]) -> None:
        self._bootstrap = bootstrap
        self._topics = set(topics)
        self._spec = spec
        self._seen: set[str] = set()
        self._missing: set[str] = set()  # seen once, missing at the last check
        self._recreated: set[str] = set()  # not yet taken by the consumer

    def take(self) -> set[str]:
        """Topics created again since the last call (the consumer counts them lost)."""
        taken, self._recreated = self._recreated, set()
        return taken

    async def run(self, list_topics: Callable[[], Awaitable[Iterable[str]]]) -> None:
        """Check now, then every ``TOPIC_CHECK_S``, until cancelled."""
        while True:
            try:
                await self.check(list_topics)
            except Exception as exc:  # a watch that died would never warn again
                log.warning("kafka_topic_check_crashed", error=repr(exc))
            await asyncio.sleep(TOPIC_CHECK_S)

    async def check(self, list_topics: Callable[[], Awaitable[Iterable[str]]]) -> None:
        """One check: re-create what was missing now and at the check before."""
        try:
            present = set(await bounded(list_topics(), LIST_TIMEOUT_S)) & self._topics
        except (KafkaError, TimeoutError) as exc:
            log.info("kafka_topic_check_failed", error=repr(exc))
            return
        missing = self._seen - present
        gone, self._missing = missing & self._missing, missing
        self._seen |= present
        if not gone:
            return
        try:
            await bounded(ensure_topics(self._bootstrap, gone, *self._spec),
                                   CREATE_TIMEOUT_S)
        except (TransportError, TimeoutError) as exc:
            log.warning("kafka_topic_recreate_failed", topics=sorted(gone), error=str(exc))
            return  # tried again at the next check
        self._seen -= gone
        self._recreated |= gone


async def seek_to_start(consumer: Any, tps: Sequence[TopicPartition]) -> None:
    """Read a lost partition's new log from its start: a position past the end need not
    be refused (Tansu answers nothing), and what the new log holds arrived after the loss.
    """
    try:
        await bounded(consumer.seek_to_beginning(*tps), SEEK_TIMEOUT_S)
    except (KafkaError, TimeoutError) as exc:  # a rebalance took them: the new owner reads
        log.info("kafka_seek_after_loss_failed", error=repr(exc))
