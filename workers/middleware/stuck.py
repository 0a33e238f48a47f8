"""A compute thread stuck past its limit, as the fleet sees it and as the worker acts on it.

While a thread abandoned by ``workers.compute`` has not returned, its model is not
fetched here (other workers take its lanes), ``/readyz`` says ``compute_not_stuck:
false`` and the heartbeat carries ``stuck_compute`` (so ``batchfleet check`` reports
it); the other models go on from a fresh thread. Python cannot kill a thread, least
of all one inside C, and each stuck one may hold memory or a device: once one has
been stuck ``stuck_exit_s``, the worker drains and exits with :data:`EXIT_STUCK`, so
its process supervisor (Kubernetes, systemd, Compose ``restart:``) starts a clean one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.workers.middleware.base import Middleware

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

#: The worker's exit code after a compute thread stayed stuck (EX_TEMPFAIL: restart me).
EXIT_STUCK = 75


class StuckCompute(Middleware):
    def __init__(self, exit_after_s: float, every_s: float = 0.5) -> None:
        self._exit_after_s = exit_after_s
        self._every_s = every_s
        self._ctx: WorkerContext | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def stuck(self) -> dict[str, float]:
        """Model -> seconds its longest-stuck thread has been abandoned."""
        if self._ctx is None:
            return {}
        out: dict[str, float] = {}
        for lane, seconds in self._ctx.compute.stuck().items():
            model = lane.partition("@")[0]
            out[model] = max(out.get(model, 0.0), seconds)
        return out

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return frozenset(self.stuck()) & models

    def readiness(self) -> dict[str, bool]:
        return {"compute_not_stuck": not self.stuck()}

    def vitals(self) -> dict[str, Any]:
        if self._ctx is None:
            return {}
        compute, default = self._ctx.compute, "@" + DEFAULT_LABEL
        limits = compute.limits.snapshot(compute.lanes)  # "model" for an unlabelled version
        return {"stuck_compute": {m: round(s, 1) for m, s in self.stuck().items()},
                "compute_limits_s": {k.removesuffix(default): v for k, v in limits.items()},
                "stalled_quarantined": self._ctx.stalled_quarantined()}

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._watch()]

    async def _watch(self) -> None:
        ctx = self._ctx
        assert ctx is not None
        while not ctx.stopping.is_set():
            await asyncio.sleep(self._every_s)
            stuck = self.stuck()
            if stuck and max(stuck.values()) > self._exit_after_s:
                log.error("compute thread stuck for good: draining, then exiting for the "
                          "supervisor to restart this worker", exit_code=EXIT_STUCK,
                          stuck_s={m: round(s, 1) for m, s in stuck.items()},
                          stuck_exit_s=self._exit_after_s)
                ctx.stop(EXIT_STUCK)
                return
