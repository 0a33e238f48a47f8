"""The rollout policy in the model registry record, against a real Redis: every change bumps
the epoch, versions are checked once workers registered any, promote/rollback semantics,
and the capped who/when/why history."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import msgpack
import pytest

from batchfleet.connectors.model_registry import (
    HISTORY_MAX,
    RedisModelRegistry,
    open_model_registry,
)
from batchfleet.connectors.redis_client import redis_client
from batchfleet.schemas.errors import UnknownModelError, ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import (
    Declaration,
    GuardThresholds,
    ModelVersion,
    RolloutPolicy,
    TensorSpec,
)

pytestmark = pytest.mark.integration
NAMES = Names("rp")
F10 = TensorSpec("float32", (10,))


@pytest.fixture
async def registry(redis_url: str) -> AsyncIterator[RedisModelRegistry]:
    reg = open_model_registry(redis_url, NAMES)
    await reg.serve("w1", {"m": [ModelVersion("v1", "sha256:a", F10),
                                 ModelVersion("v2", "sha256:b", F10),
                                 ModelVersion("v3", "sha256:c", F10)]})
    yield reg
    await reg.close()


async def test_every_change_bumps_the_epoch_and_is_recorded(registry: RedisModelRegistry,
                                                            redis_url: str) -> None:
    assert await registry.get_policy("m") == RolloutPolicy("v1")  # the worker's first version
    p1 = await registry.set_policy("m", stable="v1", canary="v2", percent=20.0,
                                   who="alice", why="try v2")
    assert (p1.epoch, p1.canary, p1.percent, p1.previous) == (1, "v2", 20.0, None)
    p2 = await registry.set_policy("m", stable="v1", canary="v2", percent=20.0, shadow="v3",
                                   who="alice")
    assert p2.epoch == 2  # even a change that only adds a shadow
    p3 = await registry.promote("m", who="bob", why="v2 looks good")
    assert (p3.stable, p3.canary, p3.percent, p3.shadow, p3.previous, p3.epoch) == (
        "v2", None, 0.0, "v3", "v1", 3)
    p4 = await registry.rollback("m", who="carol", why="shadow noisy")  # canary/shadow off first
    assert (p4.stable, p4.shadow, p4.previous, p4.epoch) == ("v2", None, "v1", 4)
    p5 = await registry.rollback("m", who="carol", why="v2 bad after all")  # then the stable
    assert (p5.stable, p5.previous, p5.epoch) == ("v1", None, 5)
    with pytest.raises(ValidationError, match="nothing to roll back"):
        await registry.rollback("m", who="carol")
    assert await registry.get_policy("m") == p5
    assert await registry.policies(["m", "absent"]) == {"m": p5}

    history = await registry.history("m")
    assert [(h.action, h.who, h.why, h.policy.epoch) for h in history] == [
        ("rollback", "carol", "v2 bad after all", 5), ("rollback", "carol", "shadow noisy", 4),
        ("promote", "bob", "v2 looks good", 3), ("set", "alice", "", 2),
        ("set", "alice", "try v2", 1)]
    assert [h.policy for h in history] == [p5, p4, p3, p2, p1]
    assert all(a.at >= b.at for a, b in itertools.pairwise(history))
    # The layout docs/wire-format.md promises, as a raw client reads it.
    raw = redis_client(redis_url)
    try:
        entry = msgpack.unpackb((await raw.lrange("rp:model:m:history", 0, 0))[0])
        policy = msgpack.unpackb(await raw.hget("rp:model:m", "policy"))
    finally:
        await raw.aclose()
    assert entry["who"] == "carol" and entry["policy"] == policy
    assert policy == {"stable": "v1", "canary": None, "percent": 0.0, "shadow": None,
                      "previous": None, "epoch": 5,
                      "guard": {"error_points": 5.0, "p99_ratio": 2.0, "min_window": 200}}


async def test_unregistered_versions_are_refused_once_workers_registered_any(
        registry: RedisModelRegistry) -> None:
    with pytest.raises(ValidationError, match=r"no version 'v9'.*registered versions: v1, v2, v3"):
        await registry.set_policy("m", stable="v1", canary="v9", percent=5.0, who="a")
    with pytest.raises(ValidationError, match="no version 'v8'"):
        await registry.set_policy("m", stable="v1", shadow="v8", who="a")
    assert (await registry.get_policy("m")).epoch == 0  # nothing written
    assert await registry.history("m") == []
    # A model only declared (no worker yet) takes any label: its workers are not up.
    await registry.declare("later", Declaration(1.0, F10))
    policy = await registry.set_policy("later", stable="v7", who="ops")
    assert (policy.stable, policy.epoch) == ("v7", 1)
    with pytest.raises(UnknownModelError):
        await registry.set_policy("nope", stable="v1", who="ops")


async def test_inconsistent_policies_are_refused(registry: RedisModelRegistry) -> None:
    for kwargs, match in [
        ({"stable": "v1", "percent": 5.0}, "needs a canary"),
        ({"stable": "v1", "canary": "v1", "percent": 5.0}, "already the stable"),
        ({"stable": "v1", "canary": "v2", "percent": 101.0}, "between 0 and 100"),
        ({"stable": "v1", "shadow": "v1"}, "stable version"),
        ({"stable": "v 1"}, "not a version label"),
    ]:
        with pytest.raises(ValidationError, match=match):
            await registry.set_policy("m", who="a", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="no canary to promote"):
        await registry.promote("m", who="a")
    with pytest.raises(ValidationError, match="p99 ratio"):
        GuardThresholds(p99_ratio=1.0)


async def test_guard_settings_are_stored_and_kept(registry: RedisModelRegistry) -> None:
    guard = GuardThresholds(error_points=10.0, p99_ratio=3.0, min_window=50)
    await registry.set_policy("m", stable="v1", canary="v2", percent=10.0, guard=guard, who="a")
    kept = await registry.set_policy("m", stable="v1", canary="v2", percent=30.0, who="a")
    assert kept.guard == guard


async def test_guard_rollback_of_a_canary_already_changed_does_nothing(
        registry: RedisModelRegistry) -> None:
    await registry.set_policy("m", stable="v1", canary="v2", percent=20.0, who="ops")
    await registry.set_policy("m", stable="v1", canary="v3", percent=20.0, who="ops")
    assert await registry.rollback("m", who="guard", why="v2 errors", if_canary="v2") is None
    assert (await registry.get_policy("m")).epoch == 2
    done = await registry.rollback("m", who="guard", why="v3 errors", if_canary="v3")
    assert done is not None and (done.canary, done.epoch) == (None, 3)
    assert (await registry.history("m"))[0].why == "v3 errors"


async def test_concurrent_changes_each_get_their_own_epoch(registry: RedisModelRegistry) -> None:
    changes = [registry.set_policy("m", stable="v1", canary="v2", percent=float(p), who=f"op{p}")
               for p in range(1, 11)]
    written = await asyncio.gather(*changes)
    assert sorted(p.epoch for p in written) == list(range(1, 11))
    history = await registry.history("m")
    assert [h.policy.epoch for h in history] == list(range(10, 0, -1))
    assert (await registry.get_policy("m")).epoch == 10


async def test_history_is_capped(registry: RedisModelRegistry) -> None:
    for i in range(HISTORY_MAX + 5):
        await registry.set_policy("m", stable="v1", canary="v2", percent=float(i % 100),
                                  who="loop")
    history = await registry.history("m", limit=HISTORY_MAX + 50)
    assert len(history) == HISTORY_MAX
    assert history[0].policy.epoch == HISTORY_MAX + 5
