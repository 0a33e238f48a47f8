"""``memory://`` model registry: each model's record as the same fields the Redis hash
holds (docs/wire-format.md, "Model registry"), decoded by the same ``schemas.registry``
code, so both backends read a record the same way.

The policy changes (``set_policy``, ``promote``, ``rollback``) are the Redis registry's
own methods: they compute a change from the record and hand it to :meth:`_change`, which
here checks the epoch and writes under the state's lock instead of in a script.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import msgpack

from batchfleet.connectors.memory_state import MemoryState
from batchfleet.connectors.model_registry import (
    _P,
    FORGET_SERVED_AFTER_S,
    HISTORY_MAX,
    RedisModelRegistry,
    Undeclared,
    _decoded,
)
from batchfleet.schemas.errors import ResultStoreError, UnknownModelError, ValidationError
from batchfleet.schemas.registry import (
    DEFAULT_LABEL,
    F_DECLARED,
    F_LANE_SHARDS,
    F_LANE_SHARDS_MAX,
    F_PAUSED,
    F_POLICY,
    SERVED_PREFIX,
    SERVED_WITHIN_S,
    VERSION_PREFIX,
    Declaration,
    ModelRecord,
    ModelVersion,
    Pause,
    PolicyChange,
    RolloutPolicy,
    decode_history,
    encode_served,
    pack,
)


def _served_at(raw: bytes) -> float:
    try:
        return float(msgpack.unpackb(raw, raw=False).get("at") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0.0


class MemoryModelRegistry(RedisModelRegistry):
    """The ``ModelRegistry`` seam in process memory."""

    def __init__(self, state: MemoryState) -> None:  # no client: nothing of Redis is used
        self._state = state
        self._hashes: dict[str, dict[str, bytes | int]] = state.setdefault("models", dict)
        self._history: dict[str, list[bytes]] = state.setdefault("model_history", dict)

    async def close(self) -> None:
        return None

    async def names(self) -> set[str]:
        with self._state.lock:
            return set(self._hashes)

    async def get(self, name: str) -> ModelRecord | None:
        with self._state.lock:
            fields = dict(self._hashes.get(name, {}))
        return _decoded(name, fields)

    async def lookup(self, name: str) -> tuple[set[str], ModelRecord | None]:
        with self._state.lock:
            known, fields = set(self._hashes), dict(self._hashes.get(name, {}))
        return known, _decoded(name, fields) if name in known else None

    async def records(self) -> list[ModelRecord]:
        with self._state.lock:
            rows = [(n, dict(f)) for n, f in sorted(self._hashes.items())]
        return [_decoded(n, f) or ModelRecord(n) for n, f in rows]

    async def set_paused(self, name: str, pause: Pause | None) -> None:
        with self._state.lock:
            fields = self._hashes.get(name)
            if not fields:
                raise UnknownModelError(f"model {name!r} is not in the registry")
            if pause is None:
                fields.pop(F_PAUSED, None)
            else:
                fields[F_PAUSED] = pack(pause.to_wire())

    async def declare(self, name: str, declaration: Declaration) -> None:
        with self._state.lock:
            if name in self._state.setdefault("pipelines", dict):
                raise ValidationError(f"{name!r} is a pipeline: a model cannot take its name "
                                      "(models and pipelines share one namespace)")
            fields = self._hashes.setdefault(name, {})
            fields[F_DECLARED] = pack(declaration.to_wire())
            fields.setdefault(F_POLICY, pack(RolloutPolicy(DEFAULT_LABEL).to_wire()))
            fields.setdefault(F_LANE_SHARDS, 1)

    async def undeclare(self, name: str, now: float | None = None) -> Undeclared:
        now = time.time() if now is None else now
        with self._state.lock:
            fields = self._hashes.get(name)
            if not fields:
                self._hashes.pop(name, None)
                return Undeclared.UNKNOWN
            fields.pop(F_DECLARED, None)
            for key, raw in fields.items():
                if key.startswith(SERVED_PREFIX) and isinstance(raw, bytes) \
                        and now - _served_at(raw) <= SERVED_WITHIN_S:
                    return Undeclared.STILL_SERVED
            del self._hashes[name]
            return Undeclared.REMOVED

    async def serve(self, worker_id: str, versions: Mapping[str, Sequence[ModelVersion]],
                    now: float | None = None, prune: bool = False,
                    lane_shards: Mapping[str, int] | None = None,
                    loaded: Mapping[str, bool] | None = None) -> int:
        if not versions:
            return 0
        now = time.time() if now is None else now
        added = 0
        with self._state.lock:
            for model, served in versions.items():
                if model not in self._hashes:
                    added += 1
                fields = self._hashes.setdefault(model, {})
                fields.update({VERSION_PREFIX + v.label: pack(v.to_wire()) for v in served})
                fields[SERVED_PREFIX + worker_id] = encode_served(
                    [v.label for v in served], now,
                    None if loaded is None else loaded.get(model))
                stable = served[0].label if served else DEFAULT_LABEL
                fields.setdefault(F_POLICY, pack(RolloutPolicy(stable).to_wire()))
                shards = (lane_shards or {}).get(model)
                if shards is None:
                    fields.setdefault(F_LANE_SHARDS, 1)
                else:
                    fields[F_LANE_SHARDS] = shards
                    if shards > int(fields.get(F_LANE_SHARDS_MAX, 1)):
                        fields[F_LANE_SHARDS_MAX] = shards
                if prune:
                    cut = now - FORGET_SERVED_AFTER_S
                    for key in [k for k, v in fields.items() if k.startswith(SERVED_PREFIX)
                                and isinstance(v, bytes) and _served_at(v) < cut]:
                        del fields[key]
        return added

    async def consumed_shards(self, names: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._state.lock:
            for name in names:
                fields = self._hashes.get(name, {})
                out[name] = max(1, int(fields.get(F_LANE_SHARDS, 1)),
                                int(fields.get(F_LANE_SHARDS_MAX, 1)))
        return out

    async def withdraw(self, worker_id: str, models: Sequence[str]) -> None:
        with self._state.lock:
            for model in models:
                self._hashes.get(model, {}).pop(SERVED_PREFIX + worker_id, None)

    async def policies(self, names: Sequence[str]) -> dict[str, RolloutPolicy]:
        out: dict[str, RolloutPolicy] = {}
        for name in names:
            with self._state.lock:
                raw = self._hashes.get(name, {}).get(F_POLICY)
            if raw is not None:
                record = _decoded(name, {F_POLICY: raw})
                if record is not None:
                    out[name] = record.policy
        return out

    async def history(self, name: str, limit: int = HISTORY_MAX) -> list[PolicyChange]:
        with self._state.lock:
            raw = list(self._history.get(name, [])[:limit])
        try:
            return decode_history(raw)
        except ValidationError as exc:
            raise ResultStoreError(f"model {name!r}: {exc}") from exc

    async def _change(self, name: str, action: str, who: str, why: str,
                      change: Callable[[ModelRecord], _P]) -> _P:
        """Compute and write in one locked step: no concurrent change can slip between."""
        with self._state.lock:
            record = await self.get(name)
            if record is None:
                raise UnknownModelError(f"model {name!r} is not in the registry")
            computed = change(record)
            if computed is None:
                return computed
            new = replace(computed, epoch=record.policy.epoch + 1)
            entry = PolicyChange(time.time(), who, why, action, new)
            self._hashes[name][F_POLICY] = pack(new.to_wire())
            history = self._history.setdefault(name, [])
            history.insert(0, pack(entry.to_wire()))
            del history[HISTORY_MAX:]
            return new
