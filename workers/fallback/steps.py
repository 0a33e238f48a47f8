"""Running a fallback chain over jobs: each step answers what it can, the rest go on.

Steps run per batch of jobs, never per request: a ``model:`` step is one forward of the
other model (on the compute thread's second lane, so the main one keeps computing), a
``rules`` step one call of the function over the whole batch on a worker thread, a
``value`` step a constant. A step that fails (the other model raises, the function
raises or returns the wrong count) answers nothing and the next step is tried; after the
last, or at ``fail``, the jobs are left unanswered and keep their failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.control_plane import ResultCache
from batchfleet.connectors.result_cache import ANY_VERSION, cache_key
from batchfleet.connectors.values import CacheEntry
from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.fallback.answers import degraded_answer
from batchfleet.workers.fallback.chain import FallbackChain, Step
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.runner import BatchRun

log = structlog.get_logger("batchfleet.fallback")
#: A ``cache`` step read slower than this answers nothing (the next step is tried).
CACHE_TIMEOUT_S = 1.0

#: Runs a batch on a version lane (``model@label``): the compute thread's aside lane.
RunModel = Callable[[str, Sequence[Job]], Awaitable[BatchRun]]
#: (model, label or None) -> (version lane, the ``model_version`` results name).
Resolve = Callable[[str, str | None], tuple[str, str]]
#: The ``cache`` step's read: per job its version-free entry, or None (a miss, an error).
Lookup = Callable[[Sequence[Job]], Awaitable[list[CacheEntry | None]]]


@dataclass
class ChainRunner:
    """One model's chain, ready to run: its ``value`` constants checked against the
    model's output and its ``rules`` functions imported (``middleware.Degrade.on_ready``)."""

    model: str
    chain: FallbackChain
    run_model: RunModel
    resolve: Resolve
    values: dict[Step, Any] = field(default_factory=dict)
    rules: dict[Step, Callable[[Any], Any]] = field(default_factory=dict)
    #: The ``cache`` step's read (set when the chain has one).
    lookup: Lookup | None = None
    #: Steps that failed, logged once each (a step failing every batch must not flood).
    _failed_once: set[Step] = field(default_factory=set)

    async def answer(self, jobs: Sequence[Job], reason: str,
                     causes: Mapping[str, ErrorInfo] | ErrorInfo, *, cheap_only: bool = False,
                     skip_model: str | None = None, inert_only: bool = False
                     ) -> tuple[list[Answer], list[Job]]:
        """Degraded answers for the jobs the chain could answer, and the jobs it could not.
        ``causes``: each request's failure by ID, or one for all (a breaker open)."""
        left = list(jobs)
        answered: list[Answer] = []
        for step in self.chain.answering(cheap_only, skip_model, inert_only):
            if not left:
                break
            outputs, versions, started, compute_ms = await self._run(step, left)
            now = time.time()
            still: list[Job] = []
            for job, out, version in zip(left, outputs, versions, strict=True):
                if out is None:
                    still.append(job)
                    continue
                cause = (causes if isinstance(causes, ErrorInfo)
                         else causes[job.request.request_id])
                answered.append(degraded_answer(job, out, step.name, reason, cause, now,
                                                model_version=version, started_at=started,
                                                compute_ms=compute_ms))
            left = still
        return answered, left

    async def _run(self, step: Step, jobs: Sequence[Job]
                   ) -> tuple[list[Any], list[str], float, float | None]:
        """Per job an output or None and the version that computed it; when, how long."""
        started = time.time()
        none: list[Any] = [None] * len(jobs)
        unversioned = [""] * len(jobs)
        if step.kind == "value":
            return [self.values[step]] * len(jobs), unversioned, started, 0.0
        if step.kind == "cache":
            entries = await self.lookup(jobs) if self.lookup is not None else none
            return ([None if e is None else e.outputs for e in entries],
                    ["" if e is None else e.model_version for e in entries], started, 0.0)
        if step.kind == "rules":
            inputs = [j.request.inputs for j in jobs]
            t0 = time.perf_counter()
            try:
                out = await asyncio.to_thread(self.rules[step], inputs)
                rows = _rows(out, len(jobs))
            except Exception as exc:  # the rules failed: the next step answers
                self._note_failure(step, exc)
                return none, unversioned, started, None
            return rows, unversioned, started, (time.perf_counter() - t0) * 1000.0
        if step.kind == "model":
            name, label = step.target()
            lane, version = self.resolve(name, label)
            run = await self.run_model(lane, jobs)
            rows = [None if isinstance(o, BaseException) else o for o in run.outputs]
            if any(r is None for r in rows):
                self._note_failure(step, next(o for o in run.outputs
                                              if isinstance(o, BaseException)))
            return rows, [version] * len(jobs), run.started_at, run.compute_s * 1000.0
        return none, unversioned, started, None

    def _note_failure(self, step: Step, exc: BaseException) -> None:
        if step not in self._failed_once:
            self._failed_once.add(step)
            log.warning("fallback step failed; the next step answers (logged once per step)",
                        model=self.model, step=step.name, error=f"{type(exc).__name__}: {exc}")


def cache_lookup(cache: ResultCache, model: str, scope_of: Callable[[Job], str]) -> Lookup:
    """The ``cache`` step's read: each job's version-free entry (``ANY_VERSION``) in its
    cache scope (``scope_of``: the scope its version's writes use), one MGET per batch; a
    request that opted out of the cache, a store error or a read slower than
    ``CACHE_TIMEOUT_S``: None (the next step answers)."""

    async def lookup(jobs: Sequence[Job]) -> list[CacheEntry | None]:
        keys = [cache_key(model, ANY_VERSION, j.request.inputs, owner=j.request.owner,
                          scope=scope_of(j)) if j.request.cache else None for j in jobs]
        wanted = [k for k in keys if k is not None]
        try:
            found = await bounded(cache.get_many(wanted), CACHE_TIMEOUT_S)
        except (BatchfleetError, TimeoutError) as exc:
            log.warning("fallback cache step could not read the cache", model=model,
                        error=str(exc) or type(exc).__name__)
            return [None] * len(jobs)
        by_key = dict(zip(wanted, found, strict=True))
        return [None if k is None else by_key.get(k) for k in keys]

    return lookup


def _rows(out: Any, count: int) -> list[Any]:
    """A rules function's return, one output per request: a sequence of ``count``, or an
    array whose first dimension is ``count``."""
    if isinstance(out, np.ndarray):
        if out.ndim == 0 or out.shape[0] != count:
            raise ValueError(f"returned an array of shape {list(out.shape)} for {count} "
                             "requests")
        return list(out)
    rows = list(out)
    if len(rows) != count:
        raise ValueError(f"returned {len(rows)} outputs for {count} requests")
    return [r if isinstance(r, dict) else np.asarray(r) for r in rows]
