"""What worker-side routing reads and records in the control plane.

* ``tables``: per model, its rollout policy, the versions that exist and the labels
  live workers hold, from the model registry records, in one round trip for all of
  a worker's models (polled about once a second).
* ``settle``: the version chosen for requests at their first fetch, recorded under
  ``{ns}:route:{model}:{request_id}`` (``SET NX`` with a TTL, then ``GET``: the first
  choice wins), one round trip per fetched batch. Only called while a canary is
  active: without one every request goes to stable and there is nothing to keep.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.schemas.errors import ResultStoreError, ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import Pause, RolloutPolicy, decode_record


@dataclass(frozen=True, slots=True)
class RouteTable:
    """One model as routing sees it."""

    policy: RolloutPolicy
    #: Labels with a ``version:`` entry in the record (registered by any worker, ever).
    versions: frozenset[str]
    #: Labels some live worker holds now: where routing may send requests.
    held: frozenset[str]
    #: An operator paused the model's lanes (``ModelRegistry.set_paused``); None: not.
    paused: Pause | None = None


#: How long a settled route is kept: a day, as long as a result by default.
ROUTE_TTL_S = 86_400


class RoutePlane:
    def __init__(self, client: aioredis.Redis, names: Names, ttl_s: int) -> None:
        self._redis = client
        self._names = names
        self._ttl_s = max(1, int(ttl_s))

    def _key(self, model: str, request_id: str) -> str:
        return f"{self._names.plane}:route:{model}:{request_id}"

    async def tables(self, models: Sequence[str], now: float | None = None
                     ) -> dict[str, RouteTable]:
        """Models without a record are left out."""
        now = time.time() if now is None else now
        with wrap_errors(ResultStoreError, "cannot read rollout policies"):
            pipe = self._redis.pipeline(transaction=False)
            for model in models:
                pipe.hgetall(self._names.model(model))
            rows = await pipe.execute()
        out: dict[str, RouteTable] = {}
        for model, fields in zip(models, rows, strict=True):
            if (table := route_table(model, fields, now)) is not None:
                out[model] = table
        return out

    async def settle(self, model: str, choices: Mapping[str, str]) -> dict[str, str]:
        """Record each request's choice unless one is recorded; returns the recorded ones."""
        if not choices:
            return {}
        with wrap_errors(ResultStoreError, "cannot record routing choices"):
            pipe = self._redis.pipeline(transaction=False)
            for request_id, label in choices.items():
                key = self._key(model, request_id)
                pipe.set(key, label, nx=True, ex=self._ttl_s)
                pipe.get(key)
            replies = await pipe.execute()
        recorded = replies[1::2]
        return {rid: (got.decode() if isinstance(got, bytes) else got) or label
                for (rid, label), got in zip(choices.items(), recorded, strict=True)}


def route_table(model: str, fields: Mapping[Any, Any], now: float) -> RouteTable | None:
    """A model's routing view of its registry record's fields (None: no record), whatever
    store read them."""
    try:
        record = decode_record(model, fields)
    except ValidationError as exc:
        raise ResultStoreError(f"the model registry holds a malformed record: {exc}") from exc
    if record is None:
        return None
    held = frozenset(label for s in record.served.values() if s.live(now)
                     for label in s.labels)
    return RouteTable(record.policy, frozenset(record.versions), held, record.paused)
