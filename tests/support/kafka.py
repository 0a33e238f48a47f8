"""A Kafka-protocol broker for the whole test session.

Tests talk to a real broker, never a mock. ``BATCHFLEET_TEST_KAFKA=host:port``
points them at an existing one (a real Apache Kafka in CI); otherwise one
in-memory Tansu broker is started for the session, because a group join
already costs seconds and a broker per test would add more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from batchfleet.connectors.embedded_kafka import EmbeddedKafka, find_tansu
from batchfleet.schemas.errors import ConfigError

ENV_VAR = "BATCHFLEET_TEST_KAFKA"


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[EmbeddedKafka | None]:
    """The broker process this session started, or None when an external one is used."""
    if os.environ.get(ENV_VAR):
        yield None
        return
    try:
        find_tansu()
    except ConfigError as exc:
        message = f"no Kafka broker for tests: {exc} (or set {ENV_VAR}=host:port)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must not go green by skipping a transport
        pytest.skip(message)
    with EmbeddedKafka() as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_broker(kafka_server: EmbeddedKafka | None) -> str:
    """Bootstrap ``host:port`` of a running broker (``kafka://`` + it is the broker URL)."""
    return kafka_server.bootstrap if kafka_server is not None else os.environ[ENV_VAR]
