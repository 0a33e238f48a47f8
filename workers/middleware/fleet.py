"""The worker's fleet-facing side loops as middleware: the heartbeat (vitals, models
re-registered, lane losses recorded) and the retry pump (due retries re-enqueued)."""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.broker import LaneLossDetection
from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.failures import Disposition, FailurePolicy
from batchfleet.workers.heartbeat import Heartbeat
from batchfleet.workers.jobs import Job
from batchfleet.workers.middleware.base import Middleware
from batchfleet.workers.retry import IDLE_PUMP_S, RetryPump

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
    once the worker is stopping. The pump sleeps until the next due time, so the failure
    policy is wrapped to wake it when this worker schedules a retry."""

    def __init__(self, idle_s: float = IDLE_PUMP_S) -> None:
        self._ctx: WorkerContext | None = None
        self._pump: RetryPump | None = None
        self._idle_s = idle_s

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def failure_policy(self, inner: FailurePolicy) -> FailurePolicy:
        return _WakingPolicy(inner, self)

    def retries_scheduled(self) -> None:
        if self._pump is not None:
            self._pump.scheduled()

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        assert self._ctx is not None
        w = self._ctx
        self._pump = RetryPump(w.plane.retry_schedule, w.publisher, idle_s=self._idle_s)
        return [self._pump.run(w.stopping)]


class _WakingPolicy:
    """``inner``, waking the retry pump after it rescheduled anything."""

    def __init__(self, inner: FailurePolicy, loop: RetryPumpLoop) -> None:
        self._inner = inner
        self._loop = loop

    async def on_failures(self, failed: Sequence[tuple[Job, ErrorInfo]]) -> Disposition:
        out = await self._inner.on_failures(failed)
        if out.rescheduled:
            self._loop.retries_scheduled()
        return out
