from __future__ import annotations

import pytest

from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.schemas.errors import ConfigError

pytestmark = pytest.mark.unit


def test_broker_urls() -> None:
    assert BrokerURL.parse("redis://h:1/0").kind == "redis"
    kafka = BrokerURL.parse("kafka://a:9092,b:9093")
    assert kafka.kind == "kafka" and kafka.kafka_bootstrap == "a:9092,b:9093"
    for bad in ("http://x", "kafka://", "kafka://nohostport", "localhost:6379"):
        with pytest.raises(ConfigError):
            BrokerURL.parse(bad)


def test_results_default_to_a_redis_broker_and_are_required_for_kafka() -> None:
    assert results_url_for(BrokerURL.parse("redis://h:1/0"), None) == "redis://h:1/0"
    with pytest.raises(ConfigError, match="needs a result store"):
        results_url_for(BrokerURL.parse("kafka://h:1"), None)
    assert results_url_for(BrokerURL.parse("kafka://h:1"), "redis://r:2/1") == "redis://r:2/1"
