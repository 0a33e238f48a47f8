"""The Kafka broker (``kafka://host:port[,host:port]``), as the ``batchfleet.brokers``
entry point registers it. aiokafka is an extra: it is imported when a publisher or a
consumer is made, and its absence is a ``ConfigError`` that names the extra."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from batchfleet.connectors.broker import Consumer, Publisher
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names


@contextmanager
def _kafka_extra() -> Iterator[None]:
    """aiokafka is an extra: a kafka:// URL without it is a config error that names it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "aiokafka":
            raise
        raise ConfigError(
            "kafka:// brokers need the kafka extra: pip install 'batchfleet[kafka]'") from exc


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    """A ``Broker``: a topic per lane, ``partitions`` each."""

    url: str
    names: Names
    partitions: int = 4
    session_timeout_ms: int = 10_000

    @property
    def bootstrap(self) -> str:
        """``host:port[,host:port]`` for aiokafka's ``bootstrap_servers``."""
        return self.url.split("://", 1)[1].rstrip("/")

    def publisher(self) -> Publisher:
        with _kafka_extra():
            from batchfleet.connectors.kafka_publisher import KafkaPublisher

        return KafkaPublisher(self.bootstrap, self.names, partitions=self.partitions)

    def consumer(self, consumer_name: str) -> Consumer:
        with _kafka_extra():
            from batchfleet.connectors.kafka import KafkaConsumer

        return KafkaConsumer(self.bootstrap, self.names, consumer_name,
                             partitions=self.partitions,
                             session_timeout_ms=self.session_timeout_ms)


def open_kafka_broker(url: str, *, namespace: str = "bf", partitions: int = 4,
                      session_timeout_ms: int = 10_000, **_: Any) -> KafkaBroker:
    """The ``batchfleet.brokers`` factory; options it does not use are ignored."""
    return KafkaBroker(url.strip(), Names(namespace), partitions, session_timeout_ms)
