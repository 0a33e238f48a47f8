"""Polling the model repository (``--model-repository``; docs/models.md, "Model
repository"): a new complete version is served without a restart, a removed model is
drained.

Every ``--repository-poll-s`` the repository is listed (on a thread: it is file or
object-store I/O). For each of the worker's repository models:

* a newer complete version (or the one left when the served one was removed) is built
  and warmed up on the loader thread while the old one keeps serving, then takes over
  on the compute thread between two batches (``ComputeThread.swap``); the registry is
  told at the next heartbeat. A build that fails is logged and tried again next poll,
  the old version still serving;
* a model with no complete version left is *drained*: its lanes are paused (its
  requests wait for a worker that has it), the batches already fetched finish, then its
  handler is dropped.

New models (a new model folder) are served from the next start: a worker's lanes are
fixed when it joins its consumer group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.workers.middleware.base import Middleware
from batchfleet.workers.middleware.pauses import base_model
from batchfleet.workers.middleware.residency import warmup_sizes
from batchfleet.workers.models import versions as model_versions
from batchfleet.workers.models.lazy import ResidentHandler
from batchfleet.workers.models.repository import Repository, Snapshot, version_maker
from batchfleet.workers.settings import WorkerSettings

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")


def repository_watch(s: WorkerSettings) -> list[Middleware]:
    return [RepositoryWatch(s)] if s.model_repository else []


class RepositoryWatch(Middleware):
    def __init__(self, settings: WorkerSettings) -> None:
        self._s = settings
        self._ctx: WorkerContext | None = None
        self._repo: Repository | None = None
        #: Models whose last version left the repository (drained, not read).
        self.removed: set[str] = set()

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._repo = await asyncio.to_thread(Repository, self._s.model_repository)

    def background_tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._poll()] if self._ctx is not None else []

    def paused_models(self, models: frozenset[str]) -> frozenset[str]:
        return frozenset(m for m in models if base_model(m) in self.removed)

    def _handlers(self) -> dict[str, ResidentHandler]:
        """The worker's repository models: model -> its (only) version's handler."""
        assert self._ctx is not None
        out = {}
        for model, labels in self._ctx.versions.items():
            handler = labels.get(DEFAULT_LABEL)
            if isinstance(handler, ResidentHandler) and handler.source:
                out[model] = handler
        return out

    async def _poll(self) -> None:
        assert self._ctx is not None
        while not self._ctx.stopping.is_set():
            await asyncio.sleep(self._s.repository_poll_s)
            try:
                await self.refresh()
            except (BatchfleetError, OSError) as exc:  # tried again next poll
                log.warning("cannot read the model repository", error=str(exc),
                            repository=self._s.model_repository)

    async def refresh(self) -> None:
        """One poll: serve what changed, drain what left."""
        assert self._repo is not None
        snapshot = await asyncio.to_thread(self._repo.scan)
        for model, handler in self._handlers().items():
            entry = snapshot.models.get(model)
            latest = entry.latest if entry is not None else None
            if latest is None:
                await self._drain(model, handler)
            elif latest != handler.tag or model in self.removed:
                await self._serve(model, handler, snapshot, latest)

    async def _serve(self, model: str, handler: ResidentHandler, snapshot: Snapshot,
                     version: str) -> None:
        ctx, repo = self._ctx, self._repo
        assert ctx is not None and repo is not None
        previous = handler.tag
        found = await asyncio.to_thread(version_maker, self._s, repo, snapshot.models[model],
                                        version)
        source = found.source
        try:
            await ctx.compute.swap(model_versions.version_lane(model, DEFAULT_LABEL),
                                   found.make, version, source,
                                   warmup_sizes(self._s.max_batch_size), found.sample)
        except Exception as exc:  # user code or a bad file: the old version keeps serving
            log.error("cannot load a new model version; the old one keeps serving",
                      model=model, version=version, serving=previous,
                      error=f"{type(exc).__name__}: {exc}")
            return
        handler.removed = False
        self.removed.discard(model)
        if ctx.served is not None:
            ctx.served.versions = model_versions.registry_versions(ctx.versions)
        log.info("serving a new model version", model=model, version=version,
                 previous=previous, source=source, loaded=handler.resident)

    async def _drain(self, model: str, handler: ResidentHandler) -> None:
        ctx = self._ctx
        assert ctx is not None
        if model not in self.removed:  # paused now; dropped from the next poll on
            self.removed.add(model)
            handler.removed = True
            log.info("model left the repository: draining it; its requests wait for a "
                     "worker that has it", model=model, version=handler.tag)
            return
        if handler.resident and not ctx.in_flight().get(model):
            await ctx.compute.unload([model_versions.version_lane(model, DEFAULT_LABEL)])
