"""``memory://``: a complete control plane in process memory.

A second implementation of every control-plane seam beside Redis's, with the same
rules (first terminal write wins, generation fencing, one dead letter per generation,
leased retries, announcements in both formats). What it is for: fast unit tests of
the runtime with no server, and a ``Client("memory://")`` talking to a worker in the
same process (a notebook, a unit test of a user's handler; docs/memory.md). All
planes and brokers opened on ``memory://NAME`` in one process share one store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.memory_control import (
    MemoryBulkJobs,
    MemoryCancels,
    MemoryFleet,
    MemoryQuotas,
)
from batchfleet.connectors.memory_outputs import MemoryOutputStats
from batchfleet.connectors.memory_pipelines import MemoryPipelineRegistry
from batchfleet.connectors.memory_registry import MemoryModelRegistry
from batchfleet.connectors.memory_results import MemoryAnnouncements, MemoryResults
from batchfleet.connectors.memory_rollout import MemoryRollouts, MemoryRolloutStats, MemoryRoutes
from batchfleet.connectors.memory_seams import (
    MemoryDeadLetters,
    MemoryHeartbeats,
    MemoryResultCache,
    MemoryRetrySchedule,
    MemoryUndecodable,
)
from batchfleet.connectors.memory_state import MemoryState, memory_state
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.schemas.names import Names

if TYPE_CHECKING:
    from batchfleet.connectors.broker import Broker
    from batchfleet.connectors.control_plane import ControlPlane


@dataclass(frozen=True, slots=True)
class MemoryControlPlane:
    """A ``ControlPlane`` whose every seam is in process memory."""

    state: MemoryState
    results: MemoryResults
    announcements: MemoryAnnouncements
    dead_letters: MemoryDeadLetters
    undecodable: MemoryUndecodable
    retry_schedule: MemoryRetrySchedule
    heartbeats: MemoryHeartbeats
    models: MemoryModelRegistry
    result_cache: MemoryResultCache
    cancels: MemoryCancels
    routes: MemoryRoutes
    rollout_stats: MemoryRolloutStats
    rollouts: MemoryRollouts
    output_stats: MemoryOutputStats
    quotas: MemoryQuotas
    bulk_jobs: MemoryBulkJobs
    pipelines: MemoryPipelineRegistry
    fleet_reader: MemoryFleet

    def request_control(self, broker: Broker) -> MemoryCancels:
        """Cancel and purge over this store's own lanes: a ``memory://`` broker on the same
        name shares them, so ``broker`` adds nothing."""
        return self.cancels

    def fleet(self, broker: Broker) -> MemoryFleet:
        """The fleet reader over this store (its lanes are the memory broker's)."""
        return self.fleet_reader

    async def close(self) -> None:
        await self.results.close()


if TYPE_CHECKING:  # mypy checks that the memory plane is a whole ControlPlane
    def _is_a_control_plane(plane: MemoryControlPlane) -> ControlPlane:
        return plane


def memory_control_plane(state: MemoryState, ttl_s: int = DEFAULT_TTL_S) -> MemoryControlPlane:
    results = MemoryResults(state, ttl_s)
    models = MemoryModelRegistry(state)
    letters = MemoryDeadLetters(state, ttl_s, models.names)
    heartbeats = MemoryHeartbeats(state)
    return MemoryControlPlane(
        state=state, results=results, announcements=MemoryAnnouncements(state),
        dead_letters=letters, undecodable=MemoryUndecodable(state),
        retry_schedule=MemoryRetrySchedule(state), heartbeats=heartbeats, models=models,
        result_cache=MemoryResultCache(state), cancels=MemoryCancels(state, results),
        routes=MemoryRoutes(state), rollout_stats=MemoryRolloutStats(state),
        rollouts=MemoryRollouts(state, models), output_stats=MemoryOutputStats(state),
        quotas=MemoryQuotas(state),
        bulk_jobs=MemoryBulkJobs(state), pipelines=MemoryPipelineRegistry(state),
        fleet_reader=MemoryFleet(heartbeats, models, letters))


def open_memory_control_plane(url: str, names: Names | None = None,
                              ttl_s: int = DEFAULT_TTL_S, max_connections: int | None = None,
                              *, namespace: str | None = None, result_ttl_s: int | None = None,
                              **_: Any) -> MemoryControlPlane:
    """The plane of ``memory://NAME`` for one namespace (``namespace`` or ``names``) and
    result TTL (``result_ttl_s`` or ``ttl_s``); connection options (``max_connections``,
    pool timeouts) mean nothing in one process and are accepted for the door's sake."""
    prefix = namespace or (names.prefix if names is not None else "bf")
    return memory_control_plane(memory_state(url, prefix),
                                ttl_s if result_ttl_s is None else result_ttl_s)
