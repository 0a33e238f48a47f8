"""The model registry record against a real Redis: layout, round trip, undeclare, self-healing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgpack
import numpy as np
import pytest

from batchfleet.connectors.model_registry import (
    FORGET_SERVED_AFTER_S,
    RedisModelRegistry,
    Undeclared,
    open_model_registry,
)
from batchfleet.connectors.redis_client import redis_client
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import (
    SERVED_WITHIN_S,
    Declaration,
    Interface,
    ModelRecord,
    ModelVersion,
    RolloutPolicy,
    Serving,
    TensorSpec,
    UnregisteredModelError,
)

pytestmark = pytest.mark.integration
NAMES = Names("mr")
F10, F1 = TensorSpec("float32", (10,)), TensorSpec("float32", (1,))


@pytest.fixture
async def registry(redis_url: str) -> AsyncIterator[RedisModelRegistry]:
    reg = open_model_registry(redis_url, NAMES)
    yield reg
    await reg.close()


async def test_record_round_trip_and_documented_layout(registry: RedisModelRegistry,
                                                       redis_url: str) -> None:
    version = ModelVersion("default", "sha256:abc", F10)
    assert await registry.serve("w1", {"m": [version]}, now=100.0) == 1
    assert await registry.serve("w1", {"m": [version]}, now=102.0) == 0  # already there
    await registry.declare("m", Declaration(50.0, F10, F1))
    record = await registry.get("m")
    assert record == ModelRecord(
        "m", versions={"default": version}, declared=Declaration(50.0, F10, F1),
        served={"w1": Serving("w1", 102.0, ("default",))},
        policy=RolloutPolicy("default"), lane_shards=1)
    assert record.declared_input == F10
    # The layout docs/wire-format.md promises, read the way a raw client would.
    raw = redis_client(redis_url)
    try:
        assert await raw.smembers("mr:models") == {b"m"}
        fields = await raw.hgetall("mr:model:m")
    finally:
        await raw.aclose()
    assert set(fields) == {b"version:default", b"declared", b"served:w1", b"policy",
                           b"lane_shards"}
    assert msgpack.unpackb(fields[b"version:default"]) == {
        "version": "sha256:abc", "input": {"dtype": "float32", "shape": [10]}, "output": None}
    assert msgpack.unpackb(fields[b"declared"]) == {
        "at": 50.0, "input": {"dtype": "float32", "shape": [10]},
        "output": {"dtype": "float32", "shape": [1]}}
    assert msgpack.unpackb(fields[b"served:w1"]) == {"at": 102.0, "labels": ["default"]}
    assert msgpack.unpackb(fields[b"policy"]) == {
        "stable": "default", "canary": None, "percent": 0.0, "shadow": None, "previous": None,
        "epoch": 0, "guard": {"error_points": 5.0, "p99_ratio": 2.0, "min_window": 200}}
    assert fields[b"lane_shards"] == b"1"
    assert await registry.lookup("m") == ({"m"}, record)
    assert await registry.lookup("other") == ({"m"}, None)
    assert [r.name for r in await registry.records()] == ["m"]


async def test_registry_comes_back_after_a_flush(registry: RedisModelRegistry,
                                                 redis_url: str) -> None:
    version = ModelVersion("default", "v1", None)
    await registry.serve("w1", {"a": [version], "b": [version]})
    raw = redis_client(redis_url)
    try:
        await raw.flushall()
    finally:
        await raw.aclose()
    assert await registry.names() == set()
    assert await registry.serve("w1", {"a": [version], "b": [version]}) == 2
    assert await registry.names() == {"a", "b"}


async def test_undeclare_keeps_a_served_model_and_removes_the_rest(
        registry: RedisModelRegistry) -> None:
    now = time.time()
    await registry.declare("only-declared", Declaration(now, F10))
    await registry.declare("served", Declaration(now, F10))
    await registry.serve("w1", {"served": [ModelVersion("default", "v1", F10)]}, now=now)
    await registry.serve("w2", {"stale": [ModelVersion("default", "v1", F10)]},
                         now=now - SERVED_WITHIN_S - 5)
    assert await registry.undeclare("only-declared", now) is Undeclared.REMOVED
    assert await registry.undeclare("served", now) is Undeclared.STILL_SERVED
    assert await registry.undeclare("stale", now) is Undeclared.REMOVED  # its worker is gone
    assert await registry.undeclare("never", now) is Undeclared.UNKNOWN
    assert await registry.names() == {"served"}
    kept = await registry.get("served")
    assert kept is not None and kept.declared is None and kept.live_workers(now) == ["w1"]


async def test_withdraw_and_prune_drop_served_entries_but_keep_the_record(
        registry: RedisModelRegistry) -> None:
    v = [ModelVersion("default", "v1", None)]
    now = time.time()
    await registry.serve("gone", {"m": v}, now=now - FORGET_SERVED_AFTER_S - 1)
    await registry.serve("stopping", {"m": v}, now=now)
    await registry.withdraw("stopping", ["m"])
    await registry.serve("live", {"m": v}, now=now, prune=True)
    record = await registry.get("m")
    assert record is not None and set(record.served) == {"live"}
    assert await registry.names() == {"m"}  # scaled to zero later, still accepted


def test_tensor_specs_parse_and_check() -> None:
    assert TensorSpec.parse("float32[10]") == F10
    assert TensorSpec.parse(" int64[ 3, 224,224 ]") == TensorSpec("int64", (3, 224, 224))
    assert TensorSpec.parse("float32[]").shape == ()
    for bad in ("float32", "float33[1]", "float32[1.5]", "float32[-1]"):
        with pytest.raises(ValidationError):
            TensorSpec.parse(bad)
    F10.check(np.zeros(10, np.float32))
    with pytest.raises(ValidationError, match=r"wrong shape: expected float32\[10\]"):
        F10.check(np.zeros(9, np.float32))
    with pytest.raises(ValidationError, match="wrong dtype: expected float32, got int64"):
        F10.check(np.zeros(10, np.int64))


def test_unknown_model_advice_fits_each_interface() -> None:
    exc = UnregisteredModelError("nope", {"b", "a"})
    assert "(known models: a, b)" in str(exc) and "check_model=False" in str(exc)
    interfaces: tuple[Interface, ...] = ("cli", "http")
    for interface in interfaces:
        advice = exc.advice(interface)
        assert "batchfleet models declare nope --input" in advice
        assert "check_model" not in advice
    assert "known models" not in exc.advice("http")  # other tenants' models stay unlisted
