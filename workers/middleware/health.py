"""The health endpoint (``/metrics``, ``/healthz``, ``/readyz``) as middleware. It binds in
``on_start``, before every other start-up check: it is the cheapest, and a taken port is a
``ConfigError`` before anything else starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from batchfleet.workers.health import HealthServer
from batchfleet.workers.middleware.base import Middleware

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext


class HealthEndpoint(Middleware):
    def __init__(self, host: str, port: int, exposition: Callable[[], bytes]) -> None:
        self._host, self._port, self._exposition = host, port, exposition
        self._server: HealthServer | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self._server = HealthServer(self._host, self._port, self._exposition, ctx.readiness)
        ctx.health_port = await self._server.start()

    async def on_stop(self, ctx: WorkerContext) -> None:
        if self._server is not None:
            await self._server.close()
