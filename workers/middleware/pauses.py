"""An operator's pause of a model's lanes (``ModelRegistry.set_paused``, from the console):
the worker stops fetching the model's lanes, as an open breaker does, until resumed.

The flag lives in the model's registry record; this middleware reads it with the same
one-round-trip read routing uses (``Routes.tables``), about once a second, and answers
``paused_models`` from the last read. A paused model's requests wait in its lanes; those
already fetched finish. Labelled versions (``model@label``) pause with their model. A
failed read keeps the last answer (a store outage neither pauses nor resumes anything).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.middleware.base import Middleware

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")

POLL_S = 1.0


def base_model(handler: str) -> str:
    """``model`` of a handler name ``model`` or ``model@label``."""
    return handler.partition("@")[0]


class OperatorPauses(Middleware):
    def __init__(self, poll_s: float = POLL_S) -> None:
        self._poll_s = poll_s
        self._ctx: WorkerContext | None = None
        #: Models an operator paused, as of the last read.
        self.paused: frozenset[str] = frozenset()

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        self._ctx = ctx
        await self.refresh()

    async def refresh(self) -> None:
        assert self._ctx is not None
        models = sorted({base_model(h) for h in self._ctx.handlers})
        tables = await self._ctx.plane.routes.tables(models)
        paused = frozenset(m for m, t in tables.items() if t.paused is not None)
        for model in sorted(paused ^ self.paused):
            table = tables.get(model)
            pause = table.paused if table is not None else None
            log.info("lanes paused by an operator" if pause else "lanes resumed", model=model,
                     who=pause.who if pause else None, why=pause.why if pause else None)
        self.paused = paused

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._poll()] if self._ctx is not None else []

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self.refresh()
            except BatchfleetError as exc:
                log.warning("cannot read lane pauses", error=str(exc))

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return frozenset(h for h in models if base_model(h) in self.paused)

    def pause_s(self) -> float | None:
        return self._poll_s / 4 if self.paused else None

    def vitals(self) -> dict[str, Any]:
        return {"operator_paused": sorted(self.paused)}
