"""Webhook enqueueing as middleware: ``before_write`` runs on the write path before the
results are written and acked (``workers.completion``), so a crash in between cannot
lose a webhook; the sink raises ``ResultStoreError`` and the write path retries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from batchfleet.workers.jobs import Answer
from batchfleet.workers.middleware.base import Middleware
from batchfleet.workers.webhooks import RQCallbackSink

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext


class Webhooks(Middleware):
    def __init__(self, sink: RQCallbackSink) -> None:
        self.sink = sink

    async def before_write(self, answers: Sequence[Answer]) -> None:
        await self.sink.enqueue(answers)

    async def on_stop(self, ctx: WorkerContext) -> None:
        self.sink.close()
