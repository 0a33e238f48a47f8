"""``memory://`` pipeline registry: the same records (encoded the same way) and the same
collision rule as Redis's, checked under the state's lock."""

from __future__ import annotations

from collections.abc import Sequence

from batchfleet.connectors.memory_state import MemoryState
from batchfleet.connectors.pipelines import _decoded, collision
from batchfleet.schemas.pipeline import Pipeline


class MemoryPipelineRegistry:
    """The ``PipelineRegistry`` seam in process memory."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state
        self._records: dict[str, bytes] = state.setdefault("pipelines", dict)
        #: The model registry's hashes (``MemoryModelRegistry``): the shared namespace.
        self._models: dict[str, object] = state.setdefault("models", dict)
        self._joins: dict[tuple[str, str], dict[str, bytes]] = state.setdefault(
            "pipeline_joins", dict)

    async def keep(self, request_ids: Sequence[str], ttl_s: int) -> None:
        with self._state.lock:
            for rid in request_ids:
                self._state.expire(rid, ttl_s)

    async def join(self, request_id: str, join: str, source: str, part: bytes,
                   expected: int) -> dict[str, bytes] | None:
        with self._state.lock:
            parts = self._joins.setdefault((request_id, join), {})
            parts[source] = part
            return dict(parts) if len(parts) >= expected else None

    async def declare(self, pipeline: Pipeline) -> None:
        with self._state.lock:
            if self._models.get(pipeline.name):
                raise collision(pipeline.name)
            self._records[pipeline.name] = pipeline.encode()

    async def get(self, name: str) -> Pipeline | None:
        with self._state.lock:
            raw = self._records.get(name)
        return None if raw is None else _decoded(raw)

    async def names(self) -> set[str]:
        with self._state.lock:
            return set(self._records)

    async def all(self) -> list[Pipeline]:
        with self._state.lock:
            rows = [raw for _, raw in sorted(self._records.items())]
        return [_decoded(r) for r in rows]

    async def remove(self, name: str) -> bool:
        with self._state.lock:
            return self._records.pop(name, None) is not None
