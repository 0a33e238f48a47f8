"""The one URL parser (``connectors.urls``): every malformed spelling is refused whole, as a
typed ``URLError``, before anything dials; the schemes come from the backend tables."""

from __future__ import annotations

import pytest

from batchfleet.connectors import registry
from batchfleet.connectors.urls import BrokerURL, parse_url, results_url_for
from batchfleet.producers import Client
from batchfleet.schemas.errors import ConfigError, URLError

pytestmark = pytest.mark.unit

#: Every way a URL has been got wrong, with the word the one-line refusal must carry.
MALFORMED = {
    "redis:/127.0.0.1:16379/0": "not scheme://",  # one slash: once localhost:6379
    "redis//127.0.0.1:6379/0": "not scheme://",
    "127.0.0.1:6379": "not scheme://",
    "redis://": "no host",
    "redis:///0": "no host",
    "redis://:pw@/0": "no host",
    "redis://h:notaport/0": "not host:port",
    "redis://h:0/0": "port '0'",
    "redis://h:70000/0": "port '70000'",
    "redis://h:/0": "port ''",
    "redis://h:6379/x": "database 'x'",
    "redis://h:6379/0/1": "not /DB",
    "redis://a:1,b:2/0": "takes one host",
    "http://h:6379/0": "unknown scheme 'http'",
    "nosuch://h": "unknown scheme 'nosuch'",
    "redis+cluster://": "no host list",
    "redis+cluster://,": "no host",
    "redis+cluster://a:1,,b:2": "no host",
    "redis+cluster://a:1,b": "has no port",
    "redis+cluster://a:1/3": "only database 0",
    "kafka://": "no host list",
    "kafka://nohostport": "has no port",
    "kafka://a:1,": "no host",
    "kafka://a:1/topic": "no path",
    "unix://": "socket path",
}
GOOD = ("redis://localhost:6379/0", "redis://h/3", "redis://h", "rediss://u:p@h:6380/1",
        "redis://[::1]:6379/0", "redis://h:6379/0?socket_timeout=3", "unix:///tmp/r.sock",
        "redis+cluster://a:7000,b:7001", "redis+cluster://:pw@a:7000/0", "kafka://k:9092",
        "kafka://a:9092,b:9093/", "memory://", "memory://nb")


@pytest.mark.parametrize(("url", "why"), MALFORMED.items())
def test_every_malformed_broker_url_is_refused_in_one_line(url: str, why: str) -> None:
    with pytest.raises(URLError) as refused:
        BrokerURL.parse(url)
    message = str(refused.value)
    assert why in message and "\n" not in message, message
    assert refused.value.url == url and isinstance(refused.value, ConfigError)


@pytest.mark.parametrize("url", GOOD)
def test_well_formed_urls_are_accepted(url: str) -> None:
    assert BrokerURL.parse(url).url == url


def test_results_urls_are_parsed_as_strictly_and_a_kafka_one_is_no_store() -> None:
    redis = BrokerURL.parse("redis://h:1/0")
    for bad in ("redis:/h:1/0", "redis://h:x/0", "kafka://h:1", "redis://h:1/y"):
        with pytest.raises(URLError):
            results_url_for(redis, bad)
    assert results_url_for(redis, None) == "redis://h:1/0"
    with pytest.raises(ConfigError, match="needs a result store"):
        results_url_for(BrokerURL.parse("kafka://h:1"), None)
    assert results_url_for(BrokerURL.parse("kafka://h:1"), "redis://r:2/1") == "redis://r:2/1"
    with pytest.raises(ConfigError, match="both be Redis Cluster"):
        results_url_for(redis, "redis+cluster://a:1")


def test_the_schemes_come_from_the_doors_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control plane registered under a new scheme is accepted with no change here, and
    becomes the default store of a broker of the same scheme; broker schemes are the
    broker registry's."""
    with pytest.raises(URLError, match="unknown scheme 'zz'"):
        results_url_for(BrokerURL.parse("kafka://k:1"), "zz://")
    planes = dict(registry.BUILT_IN[registry.PLANES_GROUP], zz="x:y")
    brokers = dict(registry.BUILT_IN[registry.BROKERS_GROUP], zz="x:y")
    monkeypatch.setitem(registry.BUILT_IN, registry.PLANES_GROUP, planes)
    monkeypatch.setitem(registry.BUILT_IN, registry.BROKERS_GROUP, brokers)
    registry.forget_installed()
    try:
        assert results_url_for(BrokerURL.parse("kafka://k:1"), "zz://x") == "zz://x"
        with pytest.raises(URLError, match="nothing after the scheme"):
            results_url_for(BrokerURL.parse("kafka://k:1"), "zz://")
        zz = BrokerURL.parse("zz://anything")
        assert zz.kind == "zz" and results_url_for(zz, None) == "zz://anything"
    finally:
        monkeypatch.undo()
        registry.forget_installed()
    assert set(registry.broker_schemes()) >= {"redis", "kafka", "redis+cluster", "memory"}
    with pytest.raises(URLError, match="schemes are kafka, memory, redis"):
        parse_url("x://h", registry.broker_schemes())


def test_a_password_never_shows_in_the_refusal() -> None:
    with pytest.raises(URLError) as refused:
        BrokerURL.parse("redis://user:s3cret@h:bad/0")
    assert "s3cret" not in str(refused.value) and "user:***@" in str(refused.value)


@pytest.mark.parametrize("url", ["redis:/127.0.0.1:6379/0", "redis://h:x/0", "kafka://"])
def test_the_sdk_refuses_a_malformed_url_with_a_typed_error(url: str) -> None:
    """``Client(...)`` raises ``URLError`` (a ``ConfigError``) before any connection."""
    with pytest.raises(URLError):
        Client(url)
    with pytest.raises(URLError):
        Client("redis://127.0.0.1:1/0", results=url)
