"""The model registry seam, and Redis's implementation of it.

One record per model (``schemas.registry``): a hash ``{ns}:model:{name}`` plus the
index set ``{ns}:models`` of every name with a record. Operators declare models
ahead of workers; workers re-assert what they serve with every heartbeat, as a
few field writes on each model's hash (never a rewrite of the record), so a
registry lost with Redis's data comes back within a beat.

A name stays in the index once served, also after its workers stop: a submit to a
model scaled to zero waits in its lane instead of being refused. ``undeclare``
is how an operator retires one: the record goes once no live worker serves it.

The rollout policy (``RolloutPolicy``: stable, canary and its percent, shadow, the
previous stable, guard thresholds and an ``epoch``) is the record's ``policy`` field.
Its API, on :class:`ModelRegistry`, is small:

* ``get_policy(model)`` / ``policies(models)`` — read (workers poll the latter, one
  round trip for all their models, and apply what has a higher epoch);
* ``set_policy(model, stable=..., canary=..., percent=..., shadow=..., guard=...,
  who=..., why=...)`` — replace it; the versions named must be registered when any
  worker has registered versions of the model;
* ``promote(model, who, why)`` — the canary becomes stable;
* ``rollback(model, who, why, if_canary=None)`` — canary and shadow off; with neither
  set, back to the previous stable. The guard passes ``if_canary`` so a rollback it
  decided on a canary an operator has since changed does nothing;
* ``history(model, limit)`` — the changes, newest first, with who/when/why.

Each change is one script: it checks the epoch the change was computed from (a
concurrent change makes it recompute), writes the policy with ``epoch + 1`` and
pushes the change onto the capped history list, so epoch and history never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from enum import Enum
from typing import Any, Protocol, TypeVar, overload

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import queue_script
from batchfleet.schemas.errors import ResultStoreError, UnknownModelError, ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import (
    DEFAULT_LABEL,
    F_LANE_SHARDS,
    F_LANE_SHARDS_MAX,
    F_PAUSED,
    F_POLICY,
    SERVED_PREFIX,
    SERVED_WITHIN_S,
    VERSION_PREFIX,
    Declaration,
    GuardThresholds,
    ModelRecord,
    ModelVersion,
    Pause,
    PolicyChange,
    RolloutPolicy,
    decode_history,
    decode_record,
    encode_served,
    pack,
)
from batchfleet.schemas.tensor_spec import TensorSpec

#: A served entry this old is a worker long gone (killed without withdrawing): dropped
#: when its model is next re-asserted with ``prune``, so worker churn cannot grow a record.
FORGET_SERVED_AFTER_S = 600.0

#: KEYS[1] the model hash, KEYS[2] the index; ARGV[1] the name, ARGV[2] now, ARGV[3] the
#: window within which a served entry is live. 0: removed, 1: still served (kept), -1: none.
_UNDECLARE = """
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
  return -1
end
redis.call('HDEL', KEYS[1], 'declared')
local now, within = tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 7) == 'served:' then
    local at = tonumber(cmsgpack.unpack(fields[i + 1])['at']) or 0
    if now - at <= within then return 1 end
  end
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 0
"""

#: KEYS[1] the model hash; ARGV[1] the cut-off: served entries last seen before it go.
_PRUNE = """
local fields = redis.call('HGETALL', KEYS[1])
local gone = 0
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 7) == 'served:' then
    local at = tonumber(cmsgpack.unpack(fields[i + 1])['at']) or 0
    if at < tonumber(ARGV[1]) then
      redis.call('HDEL', KEYS[1], fields[i])
      gone = gone + 1
    end
  end
end
return gone
"""


#: KEYS[1] the model hash; ARGV[1] the lane shard count a serving worker uses. Writes it
#: and raises the high-water mark ``lane_shards_max`` when K passes it (absent means 1,
#: so an unsharded model's record never gets the field). Returns the high-water mark.
_SET_SHARDS = """
local k = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'lane_shards', k)
local top = tonumber(redis.call('HGET', KEYS[1], 'lane_shards_max') or '1') or 1
if k > top then
  redis.call('HSET', KEYS[1], 'lane_shards_max', k)
  top = k
end
return top
"""


#: KEYS[1] the model hash, KEYS[2] the index, KEYS[3] the pipeline key of the same name;
#: ARGV[1] the name, ARGV[2] the declaration, ARGV[3] a default policy. -1: a pipeline
#: has the name (nothing written); 1: declared.
_DECLARE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
redis.call('HSET', KEYS[1], 'declared', ARGV[2])
redis.call('HSETNX', KEYS[1], 'policy', ARGV[3])
redis.call('HSETNX', KEYS[1], 'lane_shards', 1)
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""


_P = TypeVar("_P", RolloutPolicy, RolloutPolicy | None)

#: How many policy changes a model's history keeps (newest first).
HISTORY_MAX = 200
#: How often a change computed from a stale epoch is recomputed before giving up.
_POLICY_TRIES = 20

#: KEYS[1] the model hash, KEYS[2] its history list; ARGV[1] the epoch the change was
#: computed from, ARGV[2] the new policy (epoch + 1), ARGV[3] the history entry,
#: ARGV[4] the history cap. Returns the new epoch, -1 on a concurrent change, -2 when
#: the model has no record.
_SET_POLICY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local current = redis.call('HGET', KEYS[1], 'policy')
local epoch = 0
if current then epoch = tonumber(cmsgpack.unpack(current)['epoch']) or 0 end
if epoch ~= tonumber(ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1], 'policy', ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return epoch + 1
"""


class Undeclared(Enum):
    """What ``undeclare`` did."""

    REMOVED = 0
    #: The declaration is gone, but a live worker serves the model: it stays, as served.
    STILL_SERVED = 1
    UNKNOWN = -1


class ModelRegistry(Protocol):
    """Which models exist, with what versions, declared by whom and served by which workers."""

    async def names(self) -> set[str]: ...
    async def get(self, name: str) -> ModelRecord | None: ...
    async def lookup(self, name: str) -> tuple[set[str], ModelRecord | None]: ...
    async def records(self) -> list[ModelRecord]: ...
    async def declare(self, name: str, declaration: Declaration) -> None: ...
    async def undeclare(self, name: str, now: float | None = None) -> Undeclared: ...
    async def serve(self, worker_id: str, versions: Mapping[str, Sequence[ModelVersion]],
                    now: float | None = None, prune: bool = False,
                    lane_shards: Mapping[str, int] | None = None,
                    loaded: Mapping[str, bool] | None = None) -> int: ...
    async def consumed_shards(self, names: Sequence[str]) -> dict[str, int]: ...
    async def withdraw(self, worker_id: str, models: Sequence[str]) -> None: ...
    async def get_policy(self, name: str) -> RolloutPolicy: ...
    async def policies(self, names: Sequence[str]) -> dict[str, RolloutPolicy]: ...
    async def set_policy(self, name: str, *, stable: str, canary: str | None = None,
                         percent: float = 0.0, shadow: str | None = None,
                         guard: GuardThresholds | None = None, who: str, why: str = ""
                         ) -> RolloutPolicy: ...
    async def promote(self, name: str, *, who: str, why: str = "") -> RolloutPolicy: ...
    @overload
    async def rollback(self, name: str, *, who: str, why: str = "",
                       if_canary: None = None) -> RolloutPolicy: ...
    @overload
    async def rollback(self, name: str, *, who: str, why: str = "",
                       if_canary: str) -> RolloutPolicy | None: ...
    async def history(self, name: str, limit: int = HISTORY_MAX) -> list[PolicyChange]: ...
    async def set_paused(self, name: str, pause: Pause | None) -> None: ...


class RedisModelRegistry:
    """The registry in Redis; see docs/wire-format.md, "Model registry"."""

    def __init__(self, client: aioredis.Redis, names: Names, *, owns_client: bool = False
                 ) -> None:
        self._redis = client
        self._names = names
        self._owns_client = owns_client
        self._undeclare = client.register_script(_UNDECLARE)
        self._prune = client.register_script(_PRUNE)
        self._set_policy = client.register_script(_SET_POLICY)
        self._set_shards = client.register_script(_SET_SHARDS)
        self._declare = client.register_script(_DECLARE)

    async def close(self) -> None:
        """Closes the connection only if this registry opened it (``open_model_registry``)."""
        if self._owns_client:
            with wrap_errors(ResultStoreError, "cannot close the model registry"):
                await self._redis.aclose()

    @wrap_errors(ResultStoreError, "cannot read the model registry")
    async def names(self) -> set[str]:
        """Every model with a record: one round trip, however many there are."""
        return {_text(m) for m in await self._redis.smembers(self._names.model_registry)}

    async def get(self, name: str) -> ModelRecord | None:
        with wrap_errors(ResultStoreError, "cannot read the model registry"):
            fields = await self._redis.hgetall(self._names.model(name))
        return _decoded(name, fields)

    async def lookup(self, name: str) -> tuple[set[str], ModelRecord | None]:
        """The known names and one model's record, in one round trip (the SDK's check:
        an unknown model's refusal lists the known ones)."""
        with wrap_errors(ResultStoreError, "cannot read the model registry"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.smembers(self._names.model_registry)
            pipe.hgetall(self._names.model(name))
            members, fields = await pipe.execute()
        known = {_text(m) for m in members}
        return known, _decoded(name, fields) if name in known else None

    async def records(self) -> list[ModelRecord]:
        """Every record, by name (two round trips: the index, then the hashes)."""
        ordered = sorted(await self.names())
        if not ordered:
            return []
        with wrap_errors(ResultStoreError, "cannot read the model registry"):
            pipe = self._redis.pipeline(transaction=False)
            for name in ordered:
                pipe.hgetall(self._names.model(name))
            rows = await pipe.execute()
        found = (_decoded(name, fields) for name, fields in zip(ordered, rows, strict=True))
        # A name whose hash is gone (evicted) still counts: a worker re-asserts it soon.
        return [r or ModelRecord(name) for name, r in zip(ordered, found, strict=True)]

    async def set_paused(self, name: str, pause: Pause | None) -> None:
        """Pause the model's lanes (workers stop fetching them), or resume them (None).
        UnknownModelError for a model with no record."""
        key = self._names.model(name)
        with wrap_errors(ResultStoreError, f"cannot pause or resume model {name!r}"):
            if not await self._redis.exists(key):
                raise UnknownModelError(f"model {name!r} is not in the registry")
            if pause is None:
                await self._redis.hdel(key, F_PAUSED)
            else:
                await self._redis.hset(key, F_PAUSED, pack(pause.to_wire()))

    async def declare(self, name: str, declaration: Declaration) -> None:
        """Declare a model ahead of its workers (replacing an earlier declaration);
        ValidationError when a pipeline has the name."""
        n = self._names
        with wrap_errors(ResultStoreError, f"cannot declare model {name!r}"):
            done = int(await self._declare(
                keys=[n.model(name), n.model_registry, n.pipeline(name)],
                args=[name, pack(declaration.to_wire()),
                      pack(RolloutPolicy(DEFAULT_LABEL).to_wire())]))
        if done < 0:
            raise ValidationError(f"{name!r} is a pipeline: a model cannot take its name "
                                  "(models and pipelines share one namespace)")

    async def undeclare(self, name: str, now: float | None = None) -> Undeclared:
        """Withdraw a declaration. The record goes unless a live worker serves the model."""
        now = time.time() if now is None else now
        with wrap_errors(ResultStoreError, f"cannot undeclare model {name!r}"):
            done = await self._undeclare(keys=[self._names.model(name),
                                               self._names.model_registry],
                                         args=[name, now, SERVED_WITHIN_S])
        return Undeclared(int(done))

    async def serve(self, worker_id: str, versions: Mapping[str, Sequence[ModelVersion]],
                    now: float | None = None, prune: bool = False,
                    lane_shards: Mapping[str, int] | None = None,
                    loaded: Mapping[str, bool] | None = None) -> int:
        """Assert that ``worker_id`` serves these models and versions (every heartbeat).

        Per model, a few field writes: its versions, this worker's ``served`` entry, and
        a default policy only where none exists. ``lane_shards`` (model -> K, what the
        worker's ``--lane-shards`` says) is written as the model's ``lane_shards`` and
        raises ``lane_shards_max``; a model not in it gets ``lane_shards`` 1 only where
        none is set. Returns how many models were missing from the index (Redis lost its
        data). ``prune`` also drops served entries of workers unseen for
        :data:`FORGET_SERVED_AFTER_S`.
        """
        if not versions:
            return 0
        now = time.time() if now is None else now
        with wrap_errors(ResultStoreError, "cannot register models"):
            pipe = self._redis.pipeline(transaction=False)
            for model, served in versions.items():
                key = self._names.model(model)
                pipe.sadd(self._names.model_registry, model)
                pipe.hset(key, mapping={
                    **{VERSION_PREFIX + v.label: pack(v.to_wire()) for v in served},
                    SERVED_PREFIX + worker_id: encode_served(
                        [v.label for v in served], now,
                        None if loaded is None else loaded.get(model))})
                stable = served[0].label if served else DEFAULT_LABEL
                pipe.hsetnx(key, F_POLICY, pack(RolloutPolicy(stable).to_wire()))
                shards = (lane_shards or {}).get(model)
                if shards is None:
                    pipe.hsetnx(key, F_LANE_SHARDS, 1)
                else:
                    await queue_script(pipe, self._set_shards, [key], [shards])
            replies = await pipe.execute()
            if prune:
                for model in versions:
                    await self._prune(keys=[self._names.model(model)],
                                      args=[now - FORGET_SERVED_AFTER_S])
        return sum(int(r) for r in replies[0::4])

    async def consumed_shards(self, names: Sequence[str]) -> dict[str, int]:
        """Model -> how many shard streams each of its lanes has that may hold work:
        ``max(lane_shards, lane_shards_max)``, 1 without a record. One round trip; what
        workers and ``batchfleet status`` read (a model's K may have been lowered while
        its old shards still hold entries)."""
        if not names:
            return {}
        with wrap_errors(ResultStoreError, "cannot read lane shards"):
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hmget(self._names.model(name), F_LANE_SHARDS, F_LANE_SHARDS_MAX)
            rows = await pipe.execute()
        return {name: max([1, *(_count(v) for v in row)])
                for name, row in zip(names, rows, strict=True)}

    async def withdraw(self, worker_id: str, models: Sequence[str]) -> None:
        """A worker stopping says so: its served entries go (the records stay)."""
        with wrap_errors(ResultStoreError, "cannot withdraw from the model registry"):
            pipe = self._redis.pipeline(transaction=False)
            for model in models:
                pipe.hdel(self._names.model(model), SERVED_PREFIX + worker_id)
            await pipe.execute()


    async def get_policy(self, name: str) -> RolloutPolicy:
        """The model's policy; UnknownModelError when it has no record."""
        record = await self.get(name)
        if record is None:
            raise UnknownModelError(f"model {name!r} is not in the registry")
        return record.policy

    async def policies(self, names: Sequence[str]) -> dict[str, RolloutPolicy]:
        """The policies of these models in one round trip (those without a record are left
        out): what a worker polls to pick up changes without a restart."""
        if not names:
            return {}
        with wrap_errors(ResultStoreError, "cannot read rollout policies"):
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hget(self._names.model(name), F_POLICY)
            rows = await pipe.execute()
        out: dict[str, RolloutPolicy] = {}
        for name, raw in zip(names, rows, strict=True):
            if raw is not None:
                record = _decoded(name, {F_POLICY: raw})
                if record is not None:
                    out[name] = record.policy
        return out

    async def set_policy(self, name: str, *, stable: str, canary: str | None = None,
                         percent: float = 0.0, shadow: str | None = None,
                         guard: GuardThresholds | None = None, who: str, why: str = ""
                         ) -> RolloutPolicy:
        """Replace the policy (guard thresholds kept unless given); returns the new one.
        A stable change remembers the old stable as ``previous``."""
        def change(record: ModelRecord) -> RolloutPolicy:
            old = record.policy
            new = RolloutPolicy(stable, canary, percent, shadow,
                                old.stable if stable != old.stable else old.previous,
                                old.epoch, guard if guard is not None else old.guard)
            _check_versions(record, new)
            return new
        return await self._change(name, "set", who, why, change)

    async def promote(self, name: str, *, who: str, why: str = "") -> RolloutPolicy:
        """The canary becomes stable (the old stable is ``previous``); the shadow stays
        unless it was the canary."""
        def change(record: ModelRecord) -> RolloutPolicy:
            old = record.policy
            if old.canary is None:
                raise ValidationError(f"model {name!r} has no canary to promote "
                                      f"(stable is {old.stable!r})")
            return replace(old, stable=old.canary, canary=None, percent=0.0,
                           shadow=None if old.shadow == old.canary else old.shadow,
                           previous=old.stable)
        return await self._change(name, "promote", who, why, change)

    @overload
    async def rollback(self, name: str, *, who: str, why: str = "",
                       if_canary: None = None) -> RolloutPolicy: ...
    @overload
    async def rollback(self, name: str, *, who: str, why: str = "",
                       if_canary: str) -> RolloutPolicy | None: ...

    async def rollback(self, name: str, *, who: str, why: str = "",
                       if_canary: str | None = None) -> RolloutPolicy | None:
        """Canary and shadow off, stable kept; with neither set, back to the previous
        stable. With ``if_canary``, only while that version is still the canary: returns
        None (and changes nothing) otherwise. ValidationError when there is nothing to undo."""
        def change(record: ModelRecord) -> RolloutPolicy | None:
            old = record.policy
            if if_canary is not None and old.canary != if_canary:
                return None
            if old.canary is not None or old.shadow is not None:
                return replace(old, canary=None, percent=0.0, shadow=None)
            if old.previous is not None:
                return replace(old, stable=old.previous, previous=None)
            raise ValidationError(f"model {name!r} has nothing to roll back: stable is "
                                  f"{old.stable!r}, with no canary, shadow or previous stable")
        return await self._change(name, "rollback", who, why, change)

    async def history(self, name: str, limit: int = HISTORY_MAX) -> list[PolicyChange]:
        """The latest ``limit`` policy changes, newest first."""
        with wrap_errors(ResultStoreError, "cannot read the rollout history"):
            raw = await self._redis.lrange(self._names.model_history(name), 0, limit - 1)
        try:
            return decode_history([r if isinstance(r, bytes) else r.encode() for r in raw])
        except ValidationError as exc:
            raise ResultStoreError(f"model {name!r}: {exc}") from exc

    async def _change(self, name: str, action: str, who: str, why: str,
                      change: Callable[[ModelRecord], _P]) -> _P:
        """Compute a change from the current record and write it if the epoch has not
        moved meanwhile (else recompute); returns the policy written, or what ``change``
        returned when that was None."""
        for _ in range(_POLICY_TRIES):
            record = await self.get(name)
            if record is None:
                raise UnknownModelError(f"model {name!r} is not in the registry")
            computed = change(record)
            if computed is None:
                return computed
            new = replace(computed, epoch=record.policy.epoch + 1)
            entry = PolicyChange(time.time(), who, why, action, new)
            with wrap_errors(ResultStoreError, f"cannot change the rollout policy of {name!r}"):
                done = int(await self._set_policy(
                    keys=[self._names.model(name), self._names.model_history(name)],
                    args=[record.policy.epoch, pack(new.to_wire()), pack(entry.to_wire()),
                          HISTORY_MAX]))
            if done == -2:
                raise UnknownModelError(f"model {name!r} is not in the registry")
            if done > 0:
                return new
        raise ResultStoreError(f"the rollout policy of {name!r} kept changing under "
                               f"{_POLICY_TRIES} tries; try again")


def _check_versions(record: ModelRecord, policy: RolloutPolicy) -> None:
    """Refuse a version no worker registered, once workers have registered any (a model
    only declared so far takes any label: its workers are not up yet)."""
    if not record.versions:
        return
    unknown = [label for label in policy.labels if label not in record.versions]
    if unknown:
        raise ValidationError(
            f"model {record.name!r} has no version {', '.join(map(repr, unknown))}; "
            f"registered versions: {', '.join(sorted(record.versions))}")


class SpecLike(Protocol):
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


class HandlerLike(Protocol):
    """What the registry reads from a worker's model handler."""

    @property
    def version(self) -> str: ...
    @property
    def input_spec(self) -> SpecLike | None: ...


def served_version(handler: HandlerLike, label: str = DEFAULT_LABEL) -> ModelVersion:
    spec = handler.input_spec
    return ModelVersion(label, handler.version,
                        None if spec is None else TensorSpec(spec.dtype, tuple(spec.shape)),
                        source=getattr(handler, "source", ""))


class ServedModels:
    """One worker's part of the registry: asserted at start-up and every heartbeat,
    withdrawn at a graceful stop."""

    #: Prune stale served entries every this many assertions (a minute of heartbeats).
    PRUNE_EVERY = 30

    def __init__(self, registry: ModelRegistry, worker_id: str,
                 handlers: Mapping[str, HandlerLike],
                 lane_shards: Mapping[str, int] | None = None) -> None:
        self._registry = registry
        self._worker_id = worker_id
        self.versions = {name: [served_version(h)] for name, h in handlers.items()}
        #: model -> this worker's ``--lane-shards``, asserted with the versions every beat.
        self.lane_shards = dict(lane_shards or {})
        #: model -> held in memory now, for a worker that loads models on demand (None:
        #: it holds them all); asserted with the versions every beat.
        self.loaded: dict[str, bool] | None = None
        self._asserted = 0

    async def assert_served(self) -> int:
        """Returns how many models were missing from the registry (lost with Redis's data)."""
        prune = self._asserted % self.PRUNE_EVERY == 0
        self._asserted += 1
        shards = self.lane_shards or None
        if self.loaded is None:  # a registry from a plugin written before ``loaded``
            return await self._registry.serve(self._worker_id, self.versions, prune=prune,
                                              lane_shards=shards)
        return await self._registry.serve(self._worker_id, self.versions, prune=prune,
                                          lane_shards=shards, loaded=self.loaded)

    async def withdraw(self) -> None:
        await self._registry.withdraw(self._worker_id, list(self.versions))


def _decoded(name: str, fields: Mapping[Any, Any]) -> ModelRecord | None:
    try:
        return decode_record(name, fields)
    except ValidationError as exc:
        raise ResultStoreError(f"the model registry holds a malformed record: {exc}") from exc


def _count(value: bytes | str | None) -> int:
    """A shard count field; absent or malformed reads as 1 (unsharded)."""
    try:
        return max(1, int(value)) if value is not None else 1
    except ValueError:
        return 1


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_model_registry(url: str, names: Names) -> RedisModelRegistry:
    """A registry on its own connection (the CLI); workers and clients share theirs."""
    from batchfleet.connectors.redis_client import names_for, redis_client

    return RedisModelRegistry(redis_client(url), names_for(url, names), owns_client=True)
