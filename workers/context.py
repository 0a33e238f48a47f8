"""What a middleware may use of the worker it runs in: the :class:`WorkerContext`.

``on_start``, ``on_ready`` and ``on_stop`` receive it instead of the ``Worker``, so a
middleware depends on this short list, never on the spine's internals, and the spine
can change without editing thirty middleware. Everything here exists from
``on_start`` on, except ``served`` (set before ``on_ready``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from batchfleet.connectors.broker import Consumer, Delivery, Publisher
    from batchfleet.connectors.control_plane import ControlPlane, StoreResults
    from batchfleet.connectors.model_registry import ServedModels
    from batchfleet.workers.completion import ResultWriter
    from batchfleet.workers.compute import ComputeThread
    from batchfleet.workers.middleware.base import Chain, Middleware
    from batchfleet.workers.models import ModelHandler
    from batchfleet.workers.settings import WorkerSettings

A = TypeVar("A")
R = TypeVar("R")
M = TypeVar("M", bound="Middleware")


@dataclass(eq=False)
class WorkerContext:
    """The worker's settings, models, connections and the few operations middleware need.

    ``plane`` is the control plane (results, cancels, routes, rollouts, quotas, registry...)
    from the door ``open_control_plane``; ``store`` its results seam, the one the spine
    writes through; ``consumer`` and ``publisher`` the broker's; ``compute`` the compute
    thread (``device``, ``computing``, ``stuck()``). The ack, release and retry operations
    are the write path's own, so a middleware that acks or retries does it the way the
    spine does.
    """

    settings: WorkerSettings
    #: ``{model: {label: handler}}`` (``workers/models/versions.py``).
    versions: Mapping[str, Mapping[str, ModelHandler]]
    #: Each model's first version's handler.
    handlers: Mapping[str, ModelHandler]
    plane: ControlPlane
    store: StoreResults
    consumer: Consumer
    publisher: Publisher
    compute: ComputeThread
    #: Set once the worker is stopping (side loops end on it).
    stopping: asyncio.Event
    #: Stop the worker (drain, then exit with this code; 0 keeps the one it has).
    stop: Callable[[int], None]
    #: Requests fetched and not yet acked, per model.
    in_flight: Callable[[], dict[str, int]]
    #: Result writes in flight (their cap pushes back on compute).
    pending_writes: Callable[[], int]
    #: What the heartbeat and the final log line report.
    vitals: Callable[[], dict[str, Any]]
    #: ``/readyz``: ready or not, and each check.
    readiness: Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
    #: Requests quarantined as stalled since start.
    stalled_quarantined: Callable[[], int]
    _writer: ResultWriter
    _chain: Chain
    #: What this worker asserts in the model registry (set before ``on_ready``).
    served: ServedModels | None = None
    #: The health endpoint's bound port, once its middleware bound it.
    health_port: int | None = None

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Ack deliveries that need no result written (retried until it lands)."""
        await self._writer.ack(deliveries)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """Tell every middleware these deliveries are let go (for redelivery) or acked."""
        self._chain.release(deliveries)

    async def retrying(self, what: str, call: Callable[[A], Awaitable[R]], arg: A) -> R:
        """Call until it succeeds, with the write path's backoff and store-breaker notes."""
        return await self._writer.retrying(what, call, arg)

    def find(self, kind: type[M]) -> M | None:
        """The chain's middleware of a kind, if it runs one."""
        return self._chain.find(kind)
