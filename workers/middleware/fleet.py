"""The worker's fleet-facing side loops as middleware: the heartbeat (vitals, models
re-registered, lane losses recorded) and the retry pump (due retries re-enqueued)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.broker import LaneLossDetection
from batchfleet.workers.heartbeat import Heartbeat
from batchfleet.workers.middleware.base import Middleware
from batchfleet.workers.retry import RetryPump

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext


class HeartbeatLoop(Middleware):
    def __init__(self) -> None:
        self._heartbeat: Heartbeat | None = None

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        store = ctx.store
        # Each beat also re-registers the models and records the lanes the consumer had to
        # recreate after the broker lost their entries (a consumer with LaneLossDetection).
        consumer = ctx.consumer
        losses = consumer.lane_losses if isinstance(consumer, LaneLossDetection) else None
        self._heartbeat = Heartbeat(ctx.plane.heartbeats, ctx.settings.worker_id,
                                    ctx.vitals, store=store, served=ctx.served,
                                    lane_losses=losses)

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._heartbeat.run()] if self._heartbeat is not None else []

    async def on_stop(self, ctx: WorkerContext) -> None:
        if self._heartbeat is not None:
            await self._heartbeat.forget()


class RetryPumpLoop(Middleware):
    """Any worker moves any model's due retries back onto their lanes; it stops pumping
    once the worker is stopping."""

    def __init__(self) -> None:
        self._ctx: WorkerContext | None = None

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        assert self._ctx is not None
        w = self._ctx
        pump = RetryPump(w.plane.retry_schedule, w.publisher)
        return [pump.run(w.stopping)]
