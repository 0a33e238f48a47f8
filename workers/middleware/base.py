"""The hook protocol around the worker's spine (fetch -> batch -> compute -> write -> ack).

Everything that is not the spine (breakers, quarantine, leases, metrics, stats,
webhooks, the health endpoint, heartbeat and retry pump) is a :class:`Middleware`
(the list and its order: ``defaults.py``): it sees each fetch, decoded intake, batch
and completion once, never each request on its own, so a hook costs the same
whether a batch holds one request or a thousand. Every hook is a no-op here;
a middleware overrides only the ones it needs. :class:`Chain` runs a list of
them in order and is what the worker (and ``ResultWriter``) call. The lifecycle hooks
receive a :class:`~batchfleet.workers.context.WorkerContext`, never the worker.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from batchfleet.connectors.broker import Consumer, Delivery
from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.batching import ClosePolicy
from batchfleet.workers.completion import Completed, expired_answers
from batchfleet.workers.intake import Intake
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext
    from batchfleet.workers.failures import FailurePolicy


@dataclass(frozen=True, slots=True)
class BatchKey:
    """What requests must share to share a batch. ``solo_request_id`` is set for a suspect
    (redelivered after its worker died), which runs alone. ``version`` is the label the
    routing middleware chose: batches are per version."""

    lane_rank: int
    model: str
    signature: Any
    solo_request_id: str | None = None
    version: str = ""


@dataclass(slots=True)
class Batch:
    key: BatchKey
    jobs: list[Job]
    #: Jobs a middleware answered without computing them (the result cache), taken out of
    #: ``jobs``: the worker writes and acks them after ``before_compute`` (answers ready
    #: then) and with the batch's own results after ``after_compute`` (answers made from
    #: its outputs), as it does ``Intake.answers`` / ``Intake.failed`` after decode.
    answered: list[Answer] = field(default_factory=list)
    failed: list[tuple[Job, ErrorInfo]] = field(default_factory=list)

    def take_answered(self) -> tuple[list[Answer], list[tuple[Job, ErrorInfo]]]:
        """What middleware answered so far, handed over once (the lists start empty again)."""
        answered, failed = self.answered, self.failed
        self.answered, self.failed = [], []
        return answered, failed


class Middleware:
    """No-op hooks; called per fetch, batch or completion, in list order."""

    async def on_start(self, ctx: WorkerContext) -> None:
        """Connections are open, nothing fetched yet: keep what you need of ``ctx``."""

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        """Start-up checks passed and the models are warm; the loops start next."""

    async def on_stop(self, ctx: WorkerContext) -> None:
        """The loops drained (or the grace period ran out); connections still open."""

    def close_policy(self) -> ClosePolicy[BatchKey] | None:
        """When the batcher closes a not-yet-full batch, if this middleware decides it
        (the first one that does wins; none: the fixed ``max_wait_ms``)."""
        return None

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        """Side loops to run while the worker consumes (cancelled at stop)."""
        return []

    def failure_policy(self, inner: FailurePolicy) -> FailurePolicy:
        """The failure policy wrapped, or ``inner`` as is (graceful degradation answers
        from a fallback chain what the policy would have failed)."""
        return inner

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        """Which of ``models`` must not be fetched now (their lanes are paused)."""
        return frozenset()

    def on_paused(self, models: frozenset[str]) -> None:
        """The worker just stopped pulling these models' lanes."""

    def pause_s(self) -> float | None:
        """While every model is paused: how soon to look again (None: no opinion)."""
        return None

    def after_fetch(self, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        """Filter raw deliveries before decoding (a copy already being worked on)."""
        return deliveries

    async def after_decode(self, intake: Intake) -> None:
        """Move jobs to ``intake.failed`` / ``intake.finished`` or mark them solo."""

    async def before_compute(self, batch: Batch) -> bool:
        """False holds the batch back: this middleware now owns it (see ``take_held``).
        A job answered without compute moves from ``batch.jobs`` to ``batch.answered``."""
        return True

    def take_held(self) -> Batch | None:
        """A batch this middleware held that may run now (it already passed this hook)."""
        return None

    def held_wait_s(self) -> float | None:
        """How soon a held batch may be runnable; None when nothing is held."""
        return None

    def held(self) -> dict[str, int]:
        """Requests held back, per model (fetched, not acked)."""
        return {}

    async def on_dropped(self, batch: Batch) -> None:
        """A batch this middleware let through ``before_compute`` will not be computed after
        all (a later middleware forwarded or emptied it, or it expired while held): undo what
        letting it through took (a half-open breaker's probe, a suspect's solo mark)."""

    async def on_late(self, jobs: Sequence[Job]) -> tuple[list[Answer], list[Job]]:
        """Jobs whose deadline passed before they ran: answers for those this middleware
        answers (a fallback chain), and the rest (answered ``expired``)."""
        return [], list(jobs)

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        """The batch ran (its outputs, or each request's error, are in ``run``); answers made
        from them for jobs taken out before compute go to ``batch.answered`` / ``failed``."""

    async def before_write(self, answers: Sequence[Answer]) -> None:
        """Answers with a ``callback_url``, before their results are written and acked.
        Raise ``ResultStoreError`` to have the write path retry (never swallow)."""

    async def before_terminal(self, answers: Sequence[Answer]) -> None:
        """Every answer of a completion, before its result is written: what must follow
        from a terminal result (a pipeline's next step) happens here, so a crash before
        the write re-runs it on redelivery. Must be idempotent; raise ``ResultStoreError``
        or ``TransportError`` to have the write path retry (never swallow)."""

    def after_complete(self, done: Completed) -> None:
        """Results written and acked (or refused and left for redelivery)."""

    def on_store(self, ok: bool) -> None:
        """A result-store call on the write path succeeded or failed."""

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """These deliveries are acked, or let go for redelivery."""

    def readiness(self) -> dict[str, bool]:
        """Extra readiness checks (all must hold to be ready)."""
        return {}

    def vitals(self) -> dict[str, Any]:
        """What the heartbeat and the final log line report."""
        return {}


M = TypeVar("M", bound=Middleware)


class Chain:
    """A middleware list, called in order. Also ``ResultWriter``'s ``WriteHooks``
    (``before_write``, ``release``, ``on_store``), so the write path reaches every
    middleware through one object."""

    def __init__(self, middleware: Iterable[Middleware]) -> None:
        self.middleware = list(middleware)
        self._paused: frozenset[str] = frozenset()

    def find(self, kind: type[M]) -> M | None:
        return next((m for m in self.middleware if isinstance(m, kind)), None)

    async def on_start(self, ctx: WorkerContext) -> None:
        for m in self.middleware:
            await m.on_start(ctx)

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        for m in self.middleware:
            await m.on_ready(ctx, warmup_s)

    async def on_stop(self, ctx: WorkerContext) -> None:
        """Every middleware's, even when one fails (the first error is raised after)."""
        errors: list[BaseException] = []
        for m in self.middleware:
            try:
                await m.on_stop(ctx)
            except Exception as exc:  # re-raised below, once the rest have stopped
                errors.append(exc)
        if errors:
            raise errors[0]

    def close_policy(self) -> ClosePolicy[BatchKey] | None:
        """The first middleware's close policy, if any decides one."""
        return next((p for m in self.middleware if (p := m.close_policy()) is not None), None)

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [task for m in self.middleware for task in m.background_tasks()]

    def failure_policy(self, inner: FailurePolicy) -> FailurePolicy:
        """``inner`` wrapped by every middleware, the first one outermost."""
        for m in reversed(self.middleware):
            inner = m.failure_policy(inner)
        return inner

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return frozenset().union(*(m.paused_models(models) for m in self.middleware))

    def on_paused(self, models: frozenset[str]) -> None:
        for m in self.middleware:
            m.on_paused(models)

    async def sync_pauses(self, consumer: Consumer, models: frozenset[str]) -> bool:
        """Pause and resume lanes as the middleware want (an open breaker pauses only its
        model's lanes, the store's all of them); True while every model is paused."""
        want = self.paused_models(models) & models
        if want != self._paused:
            if stopped := want - self._paused:
                await consumer.pause(sorted(stopped))
                self.on_paused(stopped)
            if resumed := self._paused - want:
                await consumer.resume(sorted(resumed))
            self._paused = want
        return want >= models

    def pause_s(self) -> float:
        waits = [w for m in self.middleware if (w := m.pause_s()) is not None]
        return min(waits, default=0.1)

    def after_fetch(self, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        for m in self.middleware:
            deliveries = m.after_fetch(deliveries)
        return deliveries

    async def after_decode(self, intake: Intake) -> None:
        for m in self.middleware:
            await m.after_decode(intake)

    async def before_compute(self, batch: Batch, start: int = 0) -> bool:
        for i, m in enumerate(self.middleware[start:], start):
            if not await m.before_compute(batch):
                # held (it comes back through take_held) or gone: either way the ones
                # before it that let it through must not keep what they took for it
                await self.dropped(batch, i)
                return False
        return True

    async def dropped(self, batch: Batch, upto: int) -> None:
        """Tell the middleware before index ``upto`` (those a batch passed) that it will not
        be computed now."""
        for m in self.middleware[:upto]:
            await m.on_dropped(batch)

    def take_held(self) -> tuple[Batch, int] | None:
        """A held batch that may run now, with the index of the middleware after the one
        that held it: the rest of ``before_compute`` starts there."""
        for i, m in enumerate(self.middleware):
            batch = m.take_held()
            if batch is not None:
                return batch, i + 1
        return None

    def held_wait_s(self) -> float | None:
        return min((w for m in self.middleware if (w := m.held_wait_s()) is not None),
                   default=None)

    def held(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.middleware:
            for model, n in m.held().items():
                out[model] = out.get(model, 0) + n
        return out

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        for m in self.middleware:
            await m.after_compute(batch, run)

    async def late(self, jobs: Sequence[Job]) -> list[Answer]:
        """Answers for jobs whose deadline passed before they ran: a middleware's, or
        ``expired``."""
        answers: list[Answer] = []
        left = list(jobs)
        for m in self.middleware:
            if not left:
                break
            got, left = await m.on_late(left)
            answers += got
        return answers + expired_answers(left, time.time())

    async def before_write(self, answers: Sequence[Answer]) -> None:
        for m in self.middleware:
            await m.before_write(answers)

    async def before_terminal(self, answers: Sequence[Answer]) -> None:
        for m in self.middleware:
            await m.before_terminal(answers)

    def after_complete(self, done: Completed) -> None:
        for m in self.middleware:
            m.after_complete(done)

    def on_store(self, ok: bool) -> None:
        for m in self.middleware:
            m.on_store(ok)

    def release(self, deliveries: Sequence[Delivery]) -> None:
        for m in self.middleware:
            m.release(deliveries)

    def readiness(self) -> dict[str, bool]:
        return {k: v for m in self.middleware for k, v in m.readiness().items()}

    def vitals(self) -> dict[str, Any]:
        return {k: v for m in self.middleware for k, v in m.vitals().items()}
