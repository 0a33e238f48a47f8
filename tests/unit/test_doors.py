"""The doors' registry: the built-in schemes are registered the way a plugin's are, and
the doors pass one set of options whatever the scheme."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from batchfleet.connectors import (
    BrokerURL,
    CombinedSubmit,
    LaneLossDetection,
    LanePressure,
    ShardedLanes,
    open_broker,
    open_control_plane,
    registry,
    results_url_for,
)
from batchfleet.schemas.errors import ConfigError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_registers_exactly_the_built_in_table() -> None:
    """The entry points a wheel installs and the table a stale checkout falls back on are
    the same list, so neither can drift."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert {group: declared[group] for group in registry.BUILT_IN} == registry.BUILT_IN


def test_every_built_in_factory_resolves() -> None:
    for table in registry.BUILT_IN.values():
        for target in set(table.values()):
            module, _, attr = target.partition(":")
            assert callable(getattr(__import__(module, fromlist=[attr]), attr)), target


async def test_the_doors_take_one_set_of_options_whatever_the_scheme() -> None:
    """Nothing dials here: options a backend does not use are ignored, not refused."""
    options = {"namespace": "n", "result_ttl_s": 60, "max_connections": 4,
               "pool_timeout_s": 1.0, "partitions": 2, "claim_idle_ms": 5,
               "session_timeout_ms": 7, "max_stream_len": 9}
    plane = open_control_plane("redis://localhost:1/0", **options)
    assert plane.results.ttl_s == 60
    await plane.close()
    redis = open_broker("redis://localhost:1/0", **options)
    kafka = open_broker("kafka://localhost:1", **options)  # no aiokafka import yet
    assert isinstance(redis, CombinedSubmit) and not isinstance(kafka, CombinedSubmit)
    publisher = redis.publisher()
    assert isinstance(publisher, LanePressure)
    await publisher.close()


async def test_memory_is_a_built_in_with_a_plane_and_a_broker() -> None:
    """``memory://`` opens through the same doors and options as Redis; its consumer has
    the lane capabilities (no loss ever noted), its broker no combined submit."""
    from batchfleet.connectors.memory_state import reset_memory

    url = "memory://doors-test"
    options = {"namespace": "n", "result_ttl_s": 60, "max_connections": 4,
               "claim_idle_ms": 5, "partitions": 2, "session_timeout_ms": 7}
    plane = open_control_plane(url, **options)
    broker = open_broker(url, **options)
    try:
        assert broker.url == url and not isinstance(broker, CombinedSubmit)
        consumer, publisher = broker.consumer("w1"), broker.publisher()
        assert isinstance(consumer, ShardedLanes) and isinstance(consumer, LaneLossDetection)
        assert consumer.lane_losses == {} and isinstance(publisher, LanePressure)
        assert plane.request_control(broker) is plane.cancels
        assert (await plane.fleet(broker).read()).workers == ()
        assert results_url_for(BrokerURL.parse(url), None) == url
    finally:
        await plane.close()
        reset_memory(url)


def test_an_unknown_scheme_names_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match=r"no broker for scheme 'amqp'; installed: .*kafka"):
        open_broker("amqp://h")
    with pytest.raises(ConfigError, match=r"no control plane for scheme 'kafka'; installed: "):
        open_control_plane("kafka://h:1")


def test_results_default_to_the_broker_where_its_scheme_has_a_plane() -> None:
    assert results_url_for(BrokerURL.parse("rediss://h:1/0"), None) == "rediss://h:1/0"
    with pytest.raises(ConfigError, match="a Kafka broker needs a result store"):
        results_url_for(BrokerURL.parse("kafka://h:1"), None)


def test_the_protocols_import_only_the_neutral_values() -> None:
    """``control_plane.py`` and ``broker.py`` name a seam's own values for type checking
    only; what they import to run is ``connectors.values``, the schemas and the stdlib."""
    import ast

    for name in ("control_plane", "broker", "values", "registry"):
        tree = ast.parse((ROOT / "connectors" / f"{name}.py").read_text())
        runtime = [n for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import)]
        modules = {n.module for n in runtime if isinstance(n, ast.ImportFrom) and n.module}
        ours = {m for m in modules if m.startswith("batchfleet.")}
        assert ours <= {"batchfleet.connectors.values", "batchfleet.schemas.errors",
                        "batchfleet.schemas.heartbeat", "batchfleet.schemas.tensors"}, name
        assert not any(m.split(".")[0] in ("redis", "aiokafka") for m in modules), name


def test_a_memory_worker_runs_without_webhooks_and_says_so_otherwise() -> None:
    """Webhooks queue on Redis (RQ): a memory:// worker needs --no-webhooks (or a Redis
    for the queue), and is told so in one line."""
    from batchfleet.workers.settings import WorkerSettings

    assert not WorkerSettings.from_url("memory://w", webhooks=False).validated().webhooks
    with pytest.raises(ConfigError, match="memory:// result store, or --no-webhooks"):
        WorkerSettings.from_url("memory://w").validated()
