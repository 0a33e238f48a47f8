"""The pipeline registry seam, and Redis's implementation of it.

A pipeline (``schemas.pipeline``) is a control-plane record: ``{ns}:pipeline:{name}``
holds it (msgpack) and the set ``{ns}:pipelines`` indexes the names, so listing is one
round trip. Its name shares the model namespace: declaring a pipeline whose name has a
model record is refused, and ``models declare`` of a pipeline's name is refused
(``model_registry``), each in one script over control-plane keys that share one slot on
a cluster, so no race lets both names in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import redis.asyncio as aioredis

from batchfleet.connectors.errors import wrap_errors
from batchfleet.schemas.errors import ResultStoreError, ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.pipeline import Pipeline, check_edges, decode, specs_from_records

if TYPE_CHECKING:
    from batchfleet.connectors.model_registry import ModelRegistry

#: KEYS[1] the pipeline key, KEYS[2] the pipeline index, KEYS[3] the model hash of the
#: same name; ARGV[1] the name, ARGV[2] the record. 1: written, -1: a model has the name.
_DECLARE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""


#: KEYS[1] the join hash; ARGV[1] the source, ARGV[2] its part, ARGV[3] how many sources
#: the join waits for, ARGV[4] a TTL (s). The whole hash once every source is in, else nil.
_JOIN = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.call('HGETALL', KEYS[1])
end
return false
"""

#: How long a join's parts wait for the rest (a day: longer than any deadline a caller
#: would set; a request whose other branch failed ends failed, and its parts expire).
JOIN_TTL_S = 86_400


def collision(name: str) -> ValidationError:
    """The refusal of a pipeline named like a model (one wording for every backend)."""
    return ValidationError(f"{name!r} is a model: a pipeline cannot take its name "
                           "(models and pipelines share one namespace)")


class PipelineRegistry(Protocol):
    """Declared pipelines: what producers resolve a submit's name against."""

    async def declare(self, pipeline: Pipeline) -> None: ...
    async def get(self, name: str) -> Pipeline | None: ...
    async def names(self) -> set[str]: ...
    async def all(self) -> list[Pipeline]: ...
    async def remove(self, name: str) -> bool: ...
    async def join(self, request_id: str, join: str, source: str, part: bytes,
                   expected: int) -> dict[str, bytes] | None: ...
    async def keep(self, request_ids: Sequence[str], ttl_s: int) -> None: ...


class RedisPipelineRegistry:
    """Pipelines in Redis; see docs/wire-format.md, "Pipelines"."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names
        self._declare = client.register_script(_DECLARE)
        self._join = client.register_script(_JOIN)

    async def keep(self, request_ids: Sequence[str], ttl_s: int) -> None:
        """Keep these (step) results for ``ttl_s`` from now (``keep_intermediate_s``)."""
        if not request_ids:
            return
        with wrap_errors(ResultStoreError, "cannot keep a pipeline's step results"):
            pipe = self._redis.pipeline(transaction=False)
            for rid in request_ids:
                pipe.expire(self._names.result(rid), ttl_s)
            await pipe.execute()

    async def join(self, request_id: str, join: str, source: str, part: bytes,
                   expected: int) -> dict[str, bytes] | None:
        """Put one source's part; every part (source -> bytes) once all ``expected`` are
        in, else None. A re-put (redelivery) replaces the same field: counted once."""
        with wrap_errors(ResultStoreError, "cannot record a join's part"):
            flat = await self._join(keys=[self._names.pipeline_join(request_id, join)],
                                    args=[source, part, expected, JOIN_TTL_S])
        if not flat:
            return None
        return {_str(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}

    async def declare(self, pipeline: Pipeline) -> None:
        """Write (or replace) a pipeline; ValidationError when a model has its name."""
        n = self._names
        with wrap_errors(ResultStoreError, f"cannot declare pipeline {pipeline.name!r}"):
            done = int(await self._declare(
                keys=[n.pipeline(pipeline.name), n.pipeline_registry, n.model(pipeline.name)],
                args=[pipeline.name, pipeline.encode()]))
        if done < 0:
            raise collision(pipeline.name)

    async def get(self, name: str) -> Pipeline | None:
        with wrap_errors(ResultStoreError, "cannot read the pipeline registry"):
            raw = await self._redis.get(self._names.pipeline(name))
        return None if raw is None else _decoded(raw)

    async def names(self) -> set[str]:
        with wrap_errors(ResultStoreError, "cannot read the pipeline registry"):
            members = await self._redis.smembers(self._names.pipeline_registry)
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    async def all(self) -> list[Pipeline]:
        """Every pipeline, by name (two round trips)."""
        ordered = sorted(await self.names())
        if not ordered:
            return []
        with wrap_errors(ResultStoreError, "cannot read the pipeline registry"):
            rows = await self._redis.mget([self._names.pipeline(x) for x in ordered])
        return [_decoded(r) for r in rows if r is not None]

    async def remove(self, name: str) -> bool:
        with wrap_errors(ResultStoreError, f"cannot remove pipeline {name!r}"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(self._names.pipeline(name))
            pipe.srem(self._names.pipeline_registry, name)
            gone, _ = await pipe.execute()
        return bool(gone)


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decoded(raw: bytes | str) -> Pipeline:
    try:
        return decode(raw if isinstance(raw, bytes) else raw.encode())
    except ValidationError as exc:
        raise ResultStoreError(f"the pipeline registry holds a malformed record: {exc}") from exc


async def declare_checked(models: ModelRegistry, pipelines: PipelineRegistry,
                          pipeline: Pipeline) -> list[str]:
    """Check a pipeline against the registry, then declare it: every step's model must
    have a record, and every edge whose ends have specs must match (ValidationError
    naming the edge). Returns the edges left for the first request to check."""
    records = {m: r for m in pipeline.models if (r := await models.get(m)) is not None}
    unchecked = check_edges(pipeline, specs_from_records(pipeline, records))
    await pipelines.declare(pipeline)
    return unchecked
