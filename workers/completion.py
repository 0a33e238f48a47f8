"""Finishing a batch: build its answers, settle its failures, write its terminal results,
then ack.

Every answer is built here: from a batch's outputs (:func:`answers_from_run`), for
requests whose deadline passed while they waited (:func:`split_expired`), and for a
request refused without compute (:func:`answer_without_compute`: intake's refusals, the
failure policies' terminal failures, middleware that answer early).

This is the one path where losing work is possible, so it is strict:
failures go through the failure policy (retry schedule, DLQ) first, results
are written in one Lua call per batch, and the broker ack happens only after
both succeeded (inside that same call where the broker offers it:
``connectors.CombinedFinish``). If the store is down, each step is retried with backoff until
it lands or the worker is stopped hard; the deliveries then stay unacked and
are redelivered, never dropped.

The ack invariant, checked in code by :func:`ack_plan`: a delivery is acked only
on durable grounds. Its terminal result was written; or its write was refused,
which the store does for exactly two reasons (the ID is already terminal, or it
was replayed under a newer generation, i.e. this copy is superseded) and only
with a generation the store's Lua compares exactly (at most 2^53-1); or its
retry is parked on the schedule; or the failure policy found it superseded; or
(on the other ack paths) it was dead-lettered with its bytes, or found already
terminal. Anything else is refused loudly and left for redelivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog

from batchfleet.connectors.broker import Consumer, Delivery, FinishTrip
from batchfleet.connectors.control_plane import StoreResults, UndecodableLetters
from batchfleet.connectors.values import TerminalWrite, Undecodable
from batchfleet.schemas.envelopes import (
    MAX_EXACT_INT,
    ErrorInfo,
    Request,
    Result,
    lua_exact_generation,
)
from batchfleet.schemas.errors import ResultStoreError, TransportError
from batchfleet.schemas.result_template import encode_results
from batchfleet.workers.backoff import compute_backoff
from batchfleet.workers.jobs import Answer, Disposition, Job

if TYPE_CHECKING:
    from batchfleet.workers.failures import FailurePolicy
    from batchfleet.workers.runner import BatchRun

log = structlog.get_logger("batchfleet.completion")

A = TypeVar("A")
R = TypeVar("R")


EXPIRED = ErrorInfo("deadline_exceeded", "the request's deadline passed before it was computed")


def answer_without_compute(
    delivery: Delivery, request: Request, status: str, error: ErrorInfo, now: float,
    model_version: str = "",
) -> Answer:
    result = Result(
        request_id=request.request_id, status=status,  # type: ignore[arg-type]
        error=error, model=request.model, model_version=model_version, attempts=request.attempt,
        enqueued_at=request.enqueued_at, finished_at=now, generation=request.generation,
        queue_ms=max(0.0, (now - request.enqueued_at) * 1000.0) if request.enqueued_at else None,
        owner=request.owner,
    )
    return Answer(delivery, result, request.notify, request.generation, request.callback_url,
                  request.notify_format)


def answers_from_run(
    model: str, version: str, jobs: Sequence[Job], run: BatchRun
) -> tuple[list[Answer], list[tuple[Job, ErrorInfo]]]:
    """Succeeded answers for the outputs, and (job, error) pairs for the failure policy."""
    # One object per batch-wide field: the result template recognises a batch by identity.
    started_at, compute_ms, size = run.started_at, run.compute_s * 1000.0, len(jobs)
    finished_at = started_at + run.compute_s
    answers: list[Answer] = []
    failed: list[tuple[Job, ErrorInfo]] = []
    for job, output in zip(jobs, run.outputs, strict=True):
        req = job.request
        job.model_version = version
        if isinstance(output, BaseException):
            failed.append((job, ErrorInfo.from_exception(output)))
            continue
        # positional, in field order: this runs once per request
        result = Result(
            req.request_id, "succeeded", output, None, model, version, req.attempt,
            req.enqueued_at, started_at, finished_at,
            max(0.0, (started_at - req.enqueued_at) * 1000.0), compute_ms, size,
            req.generation, {}, req.owner,
        )
        answers.append(Answer(job.delivery, result, req.notify, req.generation,
                              req.callback_url, req.notify_format))
    return answers, failed


def split_expired(jobs: Sequence[Job], now: float) -> tuple[list[Job], list[Answer]]:
    """Drop jobs whose deadline passed while they waited in the batcher: they are never run."""
    live, late = split_late(jobs, now)
    return live, expired_answers(late, now)


def split_late(jobs: Sequence[Job], now: float) -> tuple[list[Job], list[Job]]:
    """Jobs whose deadline has not passed, and those whose deadline has (never run)."""
    live: list[Job] = []
    late: list[Job] = []
    for job in jobs:
        deadline = job.request.deadline_at
        (late if deadline is not None and deadline <= now else live).append(job)
    return live, late


def expired_answers(jobs: Sequence[Job], now: float) -> list[Answer]:
    return [answer_without_compute(job.delivery, job.request, "expired", EXPIRED, now)
            for job in jobs]


@dataclass(slots=True)
class Completed:
    """What one completion did: the answers written, whether each write won, and more."""

    answers: list[Answer] = field(default_factory=list)
    won: list[bool] = field(default_factory=list)
    rescheduled: list[Delivery] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    #: Copies dropped as superseded (newer generation, or finished meanwhile), acked.
    superseded: list[Delivery] = field(default_factory=list)
    #: Deliveries left unacked because nothing durable backs them (see ack_plan).
    refused: list[Delivery] = field(default_factory=list)


def ack_plan(answers: Sequence[Answer], won: Sequence[bool], parked: Sequence[Delivery] = (),
             superseded: Sequence[Delivery] = ()) -> tuple[list[Delivery], list[Delivery]]:
    """Split a completion's deliveries into those it may ack and those it must not.

    An answer's delivery may be acked when its write won, or when the store refused
    it and the refusal can be trusted: a generation outside 0..2^53-1 compares wrongly
    inside Lua, so a refusal then proves nothing (that is how a request once vanished).
    Parked retries and superseded copies have their own durable grounds.
    """
    if len(won) != len(answers):
        raise ValueError(f"{len(answers)} answers but {len(won)} write outcomes")
    ok: list[Delivery] = []
    refused: list[Delivery] = []
    for answer, first in zip(answers, won, strict=True):
        (ok if first or refusal_trusted(answer) else refused).append(answer.delivery)
    return [*ok, *parked, *superseded], refused


def refusal_trusted(answer: Answer) -> bool:
    """The store compares this answer's generation exactly, so a refused write proves the
    request is terminal or superseded: its delivery may be acked whatever the outcome."""
    return 0 <= answer.generation <= MAX_EXACT_INT


def storable(answer: Answer) -> Answer:
    """The answer with a generation the store compares exactly: a bad-input answer can
    carry whatever generation the raw message claimed, and its ``failed`` result must
    land (under generation 0) rather than be refused as if stale."""
    gen = lua_exact_generation(answer.generation)
    if gen == answer.generation:
        return answer
    return replace(answer, generation=gen, result=replace(answer.result, generation=gen))


class WriteHooks(Protocol):
    """What the write path tells the rest of the worker, through one object (the worker
    passes its middleware ``Chain``)."""

    async def before_write(self, answers: Sequence[Answer]) -> None:
        """Terminal answers that carry a ``callback_url`` (webhook delivery), before their
        write. Must be idempotent per (request ID, generation) and raise ResultStoreError
        when it cannot take them, so the write path retries instead of losing a callback."""
        ...

    async def before_terminal(self, answers: Sequence[Answer]) -> None:
        """Every answer, before the write: what follows from a terminal result (a
        pipeline's next step). Idempotent; raises ResultStoreError or TransportError
        when it cannot be done, so the write path retries."""
        ...

    def release(self, deliveries: Sequence[Delivery]) -> None:
        """These deliveries are acked or let go (the worker's leases stop holding them)."""
        ...

    def on_store(self, ok: bool) -> None:
        """A result-store call on the write path succeeded or failed (the store breaker)."""
        ...


class NoWriteHooks:
    """:class:`WriteHooks` that do nothing (a writer used on its own)."""

    async def before_write(self, answers: Sequence[Answer]) -> None:
        pass

    async def before_terminal(self, answers: Sequence[Answer]) -> None:
        pass

    def release(self, deliveries: Sequence[Delivery]) -> None:
        pass

    def on_store(self, ok: bool) -> None:
        pass


class ResultWriter:
    def __init__(
        self,
        store: StoreResults,
        consumer: Consumer,
        dead_letters: UndecodableLetters,
        policy: FailurePolicy,
        *,
        hooks: WriteHooks | None = None,
        retry_base_s: float = 0.05,
        retry_cap_s: float = 2.0,
        finish: FinishTrip | None = None,
    ) -> None:
        #: The write and the ack in one call, where the broker offers it
        #: (``connectors.CombinedFinish``); None: a write, then an ack.
        self._finish = finish
        self._store = store
        self._consumer = consumer
        self._dead_letters = dead_letters
        self._policy = policy
        self._hooks: WriteHooks = NoWriteHooks() if hooks is None else hooks
        self._base = retry_base_s
        self._cap = retry_cap_s

    async def complete(
        self, answers: Sequence[Answer], failed: Sequence[tuple[Job, ErrorInfo]] = ()
    ) -> Completed:
        try:
            return await self._complete(answers, failed)
        except BaseException:
            # Cancelled at the grace deadline, or a bug: whatever is not acked must be let
            # go, or its lease would keep it from every other worker while this one lives.
            self._release([a.delivery for a in answers] + [j.delivery for j, _ in failed])
            raise

    async def _complete(
        self, answers: Sequence[Answer], failed: Sequence[tuple[Job, ErrorInfo]]
    ) -> Completed:
        settled = (await self.retrying("failure policy", self._policy.on_failures, failed)
                   if failed else Disposition())
        all_answers = [storable(a) for a in (*answers, *settled.answers)]
        bodies = encode_results([a.result for a in all_answers])
        writes = [
            TerminalWrite(a.result.request_id, a.result.status, body, a.notify, a.generation,
                          a.notify_format)
            for a, body in zip(all_answers, bodies, strict=True)
        ]
        if all_answers:
            # Before the write too: a pipeline step's successor is enqueued (or its
            # caller answered) first, so a crash in between re-runs it on redelivery.
            await self.retrying("advance", self._hooks.before_terminal, all_answers)
        hooked = [a for a in all_answers if a.callback_url]
        if hooked:
            # Before the write, so a crash in between cannot lose a webhook. The sink is
            # idempotent per (request, generation) and delivers the result *stored* by then,
            # so a duplicate or a losing write never sends a second or a wrong result.
            await self.retrying("enqueue webhooks", self._hooks.before_write, hooked)
        if self._finish is not None and writes:
            won, to_ack, refused = await self._write_and_ack(self._finish, all_answers,
                                                             writes, settled)
        else:
            won = await self.retrying("write results", self._store.write_terminal, writes)
            to_ack, refused = ack_plan(all_answers, won, settled.rescheduled,
                                       settled.superseded)
        if refused:
            log.error("not acking deliveries with no durable outcome; they will be redelivered",
                      request_ids=[a.result.request_id for a in all_answers
                                   if a.delivery in refused])
            self._release(refused)
        await self._ack(to_ack)
        return Completed(all_answers, won, settled.rescheduled, settled.dead_lettered,
                         settled.superseded, refused)

    async def _write_and_ack(self, finish: FinishTrip, answers: Sequence[Answer],
                             writes: list[TerminalWrite], settled: Disposition
                             ) -> tuple[list[bool], list[Delivery], list[Delivery]]:
        """The write with, in the same call, the ack of every delivery :func:`ack_plan`
        acks whatever the write's outcome. Returns the outcomes, then, of the answers whose
        generation the store cannot compare exactly (none in practice, since
        :func:`storable` makes every generation exact), those that won and still need an
        ack and those refused, as :func:`ack_plan` splits them."""
        sure: list[Delivery] = []
        unsure: list[int] = []  # indices into answers
        for i, answer in enumerate(answers):
            if refusal_trusted(answer):
                sure.append(answer.delivery)
            else:
                unsure.append(i)
        sure += [*settled.rescheduled, *settled.superseded]
        won = await self.retrying(
            "write results and ack", lambda w: finish.write_and_ack(w, sure), writes)
        self._release(sure)
        later = [answers[i].delivery for i in unsure if won[i]]
        refused = [answers[i].delivery for i in unsure if not won[i]]
        return won, later, refused

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Ack deliveries that need no result written: theirs is terminal already, or a
        newer generation superseded them."""
        await self._ack(deliveries)

    async def dead_letter(self, items: Sequence[tuple[Delivery, Undecodable]]) -> None:
        """Keep undecodable messages with their raw bytes, then ack them so they never block."""
        if not items:
            return
        for _, item in items:
            log.warning("undecodable message dead-lettered", source=item.source,
                        reason=item.reason, raw_bytes=len(item.raw))
        await self.retrying("dead-letter", self._dead_letters.add, [u for _, u in items])
        await self._ack([d for d, _ in items])

    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        if deliveries:
            await self.retrying("ack", self._consumer.ack, deliveries)
        self._release(deliveries)

    def _release(self, deliveries: Sequence[Delivery]) -> None:
        self._hooks.release(deliveries)

    async def retrying(self, what: str, call: Callable[[A], Awaitable[R]], arg: A) -> R:
        """Call until it succeeds, with backoff: on these paths giving up would lose work."""
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await call(arg)
            except (ResultStoreError, TransportError) as exc:
                if isinstance(exc, ResultStoreError):
                    self._hooks.on_store(False)
                delay = compute_backoff(attempt, base_s=self._base, cap_s=self._cap)
                log.warning("retrying after failure", stage=what, attempt=attempt,
                            error=str(exc), retry_in_s=round(delay, 3))
                await asyncio.sleep(delay)
                continue
            self._hooks.on_store(True)
            return result
