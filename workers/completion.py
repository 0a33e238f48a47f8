"""Finishing a batch: settle its failures, write its terminal results, then ack.

This is the one path where losing work is possible, so it is strict:
failures go through the failure policy (retry schedule, DLQ) first, results
are written in one Lua call per batch, and the broker ack happens only after
both succeeded. If the store is down, each step is retried with backoff until
it lands or the worker is stopped hard; the deliveries then stay unacked and
are redelivered, never dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import structlog

from connectors.broker import Consumer, Delivery
from connectors.dead_letters import Undecodable, UndecodableSink
from connectors.result_store import ResultStore, TerminalWrite
from schemas.envelopes import ErrorInfo, encode_result
from schemas.errors import ResultStoreError, TransportError
from workers.backoff import compute_backoff
from workers.failures import Disposition, FailurePolicy
from workers.intake import Answer, Job

log = structlog.get_logger("batchfleet.completion")

A = TypeVar("A")
R = TypeVar("R")


@dataclass(slots=True)
class Completed:
    """What one completion did: the answers written, whether each write won, and more."""

    answers: list[Answer] = field(default_factory=list)
    won: list[bool] = field(default_factory=list)
    rescheduled: list[Delivery] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)


class CallbackSink(Protocol):
    """Takes terminal answers that carry a ``callback_url`` (webhook delivery). Must be
    idempotent per (request ID, generation) and raise ResultStoreError when it cannot
    enqueue, so the write path retries instead of losing the callback."""

    async def enqueue(self, answers: Sequence[Answer]) -> None: ...


class ResultWriter:
    def __init__(
        self,
        store: ResultStore,
        consumer: Consumer,
        dead_letters: UndecodableSink,
        policy: FailurePolicy,
        *,
        callbacks: CallbackSink | None = None,
        on_store: Callable[[bool], None] = lambda ok: None,
        retry_base_s: float = 0.05,
        retry_cap_s: float = 2.0,
    ) -> None:
        self._store = store
        self._consumer = consumer
        self._dead_letters = dead_letters
        self._policy = policy
        self._callbacks = callbacks
        self._on_store = on_store
        self._base = retry_base_s
        self._cap = retry_cap_s

    async def complete(
        self, answers: Sequence[Answer], failed: Sequence[tuple[Job, ErrorInfo]] = ()
    ) -> Completed:
        settled = (await self.retrying("failure policy", self._policy.on_failures, failed)
                   if failed else Disposition())
        all_answers = [*answers, *settled.answers]
        writes = [
            TerminalWrite(a.result.request_id, a.result.status, encode_result(a.result),
                          a.notify, a.generation)
            for a in all_answers
        ]
        hooked = [a for a in all_answers if a.callback_url]
        if hooked and self._callbacks is not None:
            # Before the write, so a crash in between cannot lose a webhook. The sink is
            # idempotent per (request, generation) and delivers the result *stored* by then,
            # so a duplicate or a losing write never sends a second or a wrong result.
            await self.retrying("enqueue webhooks", self._callbacks.enqueue, hooked)
        won = await self.retrying("write results", self._store.write_terminal, writes)
        to_ack: list[Delivery] = [a.delivery for a in all_answers] + settled.rescheduled
        await self.retrying("ack", self._consumer.ack, to_ack)
        return Completed(all_answers, won, settled.rescheduled, settled.dead_lettered)

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Ack deliveries that need no result written (theirs already is)."""
        await self.retrying("ack", self._consumer.ack, deliveries)

    async def dead_letter(self, items: Sequence[tuple[Delivery, Undecodable]]) -> None:
        """Keep undecodable messages with their raw bytes, then ack them so they never block."""
        if not items:
            return
        for _, item in items:
            log.warning("undecodable message dead-lettered", source=item.source,
                        reason=item.reason, raw_bytes=len(item.raw))
        await self.retrying("dead-letter", self._dead_letters.add, [u for _, u in items])
        await self.retrying("ack", self._consumer.ack, [d for d, _ in items])

    async def retrying(self, what: str, call: Callable[[A], Awaitable[R]], arg: A) -> R:
        """Call until it succeeds, with backoff: on these paths giving up would lose work."""
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await call(arg)
            except (ResultStoreError, TransportError) as exc:
                if isinstance(exc, ResultStoreError):
                    self._on_store(False)
                delay = compute_backoff(attempt, base_s=self._base, cap_s=self._cap)
                log.warning("retrying after failure", stage=what, attempt=attempt,
                            error=str(exc), retry_in_s=round(delay, 3))
                await asyncio.sleep(delay)
                continue
            self._on_store(True)
            return result
