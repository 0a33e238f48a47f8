"""The result cache as middleware: repeats answered from a stored output, twins computed once.

Opt in per model with ``--cache-ttl-s`` (``workers/settings.py``; 0 is off). For a batch
of a model with a TTL, ``before_compute``:

* keys each request that did not opt out (``cache: false``) by
  ``connectors.result_cache.cache_key`` over model, the full ``model_version`` (label,
  weights hash, runtime, precision), its input bytes and, under the default
  ``--cache-scope owner``, the request's owner, so a new version never reads an old
  entry and one tenant never reads (nor is coalesced with) another's;
* reads every distinct key in **one** round trip (``ResultCache.get_many``, an MGET);
* moves each hit to ``batch.answered`` (written and acked by the worker at once, with
  ``cached: true`` and the ``model_version`` that computed it), and each later twin of a
  key already in the batch out of ``batch.jobs``, so identical inputs compute once.

``after_compute`` answers the twins from their first copy's row (``batch.answered``, or
``batch.failed`` when that row failed, so the failure policy retries each) and stores
the batch's new outputs in **one** round trip (``put_many``: SET with the TTL), before
the results are written, so a repeat submitted after a result is seen finds it.

A cache store error (Redis down, a slow reply past :data:`TIMEOUT_S`) never fails a
request: the lookup reads as all misses, the store is skipped, each failure is counted
(``batchfleet_cache_errors_total``, heartbeat ``cache_errors``) and logged once until the
cache answers again. See docs/cache.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

import structlog

from batchfleet.connectors.cancelling import bounded
from batchfleet.connectors.control_plane import ResultCache
from batchfleet.connectors.result_cache import ANY_VERSION, SCOPE_OWNER, cache_key
from batchfleet.connectors.values import CacheEntry
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.completion import answers_from_run
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.models.versions import model_version
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext

log = structlog.get_logger("batchfleet.worker")
T = TypeVar("T")

#: A cache read or write slower than this counts as failed (a miss): the cache must never
#: hold a batch up for long.
TIMEOUT_S = 1.0
#: The default ``--cache-scope``: each owner its own entries.
BY_OWNER: Final[PerModel[str]] = PerModel(SCOPE_OWNER)


def scope_for(scopes: PerModel[str], model: str, label: str | None) -> str:
    """The cache scope of one model version's entries: the one resolver for the cache's
    reads and writes and the fallback ``cache`` step's reads, so a per-version
    ``--cache-scope MODEL@VERSION=…`` reads where it wrote."""
    return scopes.for_model(model, label or None)
#: The default ``--cache-stale-s``: version-free entries live as long as the others.
NO_STALE: Final[PerModel[int]] = PerModel(0)
#: A twin whose first copy vanished from the batch before compute (never expected).
_LOST = ErrorInfo("internal_error", "its identical request left the batch before compute",
                  retryable=True)


@dataclass(slots=True)
class CacheCounts:
    """What the heartbeat reports (``cache_*`` counters; ``batchfleet status``)."""

    hits: int = 0
    coalesced: int = 0
    misses: int = 0
    errors: int = 0
    saved_s: float = 0.0


@dataclass(slots=True)
class _Plan:
    """One batch's cache work between ``before_compute`` and ``after_compute``."""

    batch: Batch  # held, so the batch's id() cannot be reused while the plan lives
    version: str
    ttl_s: int
    #: id(job) -> key, for the jobs left to compute whose outputs are to be stored.
    store: dict[int, str] = field(default_factory=dict)
    #: (twin, the job it copies): answered from that job's row.
    twins: list[tuple[Job, Job]] = field(default_factory=list)


class CachedResults(Middleware):
    def __init__(self, ttl_s: PerModel[int], metrics: WorkerMetrics | None = None,
                 cache: ResultCache | None = None, timeout_s: float = TIMEOUT_S,
                 scope: PerModel[str] = BY_OWNER, *, fallback: frozenset[str] = frozenset(),
                 stale_s: PerModel[int] = NO_STALE) -> None:
        self._ttl = ttl_s
        #: Models whose fallback chain has a ``cache`` step: their outputs are also stored
        #: under a version-free key, kept ``stale_s`` longer (docs/degradation.md).
        self._fallback = fallback
        self._stale = stale_s
        self._scope = scope
        self._metrics = metrics
        self._cache = cache
        self._timeout_s = timeout_s
        self._ctx: WorkerContext | None = None
        self._plans: dict[int, _Plan] = {}
        self._failing = False
        self.counts = CacheCounts()

    async def on_start(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        if self._cache is None:
            self._cache = ctx.plane.result_cache

    # --- before compute: hits out, twins out ---------------------------------------------

    async def before_compute(self, batch: Batch) -> bool:
        ctx, model, label = self._ctx, batch.key.model, batch.key.version
        ttl = self._ttl.for_model(model, label or None)
        if ttl <= 0 or ctx is None or label not in ctx.versions.get(model, {}):
            return True
        version = model_version(label, ctx.versions[model][label])
        scope = scope_for(self._scope, model, label)
        keys = {id(job): cache_key(model, version, job.request.inputs,
                                   owner=job.request.owner, scope=scope)
                for job in batch.jobs if job.request.cache}
        if not keys:
            return True
        distinct = list(dict.fromkeys(keys.values()))
        entries = await self._call(model, "read", self._get(distinct))
        found = {k: e for k, e in zip(distinct, entries or (), strict=False)
                 if e is not None and e.model_version == version}
        plan = _Plan(batch, version, ttl)
        first: dict[str, Job] = {}
        hits: list[tuple[Job, CacheEntry]] = []
        computed: list[Job] = []
        for job in batch.jobs:
            key = keys.get(id(job))
            if key is None:
                computed.append(job)
            elif key in found:
                hits.append((job, found[key]))
            elif key in first:
                plan.twins.append((job, first[key]))
            else:
                first[key] = job
                plan.store[id(job)] = key
                computed.append(job)
        batch.jobs = computed
        now = time.time()
        batch.answered += [_hit(job, entry, now) for job, entry in hits]
        self._count(model, hits=len(hits), misses=len(plan.store),
                    saved_s=sum(entry.compute_s for _, entry in hits))
        if plan.store:
            self._plans[id(batch)] = plan
        return bool(computed)

    async def on_dropped(self, batch: Batch) -> None:
        """A later middleware held or forwarded the batch: its twins go back in, to run."""
        plan = self._plans.pop(id(batch), None)
        if plan is not None and plan.batch is batch:
            batch.jobs += [twin for twin, _ in plan.twins]

    # --- after compute: twins answered, new outputs stored -------------------------------

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        plan = self._plans.pop(id(batch), None)
        if plan is None or plan.batch is not batch:
            return
        model = batch.key.model
        row = {id(job): out for job, out in zip(batch.jobs, run.outputs, strict=False)}
        if plan.twins:
            self._answer_twins(batch, run, plan, row)
        rows = max(1, len(batch.jobs))
        per_row_s = run.compute_s / rows
        fresh = [(key, CacheEntry(plan.version, out, per_row_s))
                 for job_id, key in plan.store.items()
                 if (out := row.get(job_id)) is not None and not isinstance(out, BaseException)]
        if fresh:
            await self._call(model, "write", self._put(fresh, plan.ttl_s))
        if fresh and model in self._fallback:
            await self._store_any_version(batch, plan, row)

    async def _store_any_version(self, batch: Batch, plan: _Plan, row: dict[int, Any]) -> None:
        """The same outputs under version-free keys, for the fallback ``cache`` step only:
        the normal lookup never reads them, so ``--cache-stale-s`` never serves a stale
        answer as a fresh one."""
        model, label = batch.key.model, batch.key.version
        scope = scope_for(self._scope, model, label)
        per_row_s = 0.0
        entries = [(cache_key(model, ANY_VERSION, job.request.inputs, owner=job.request.owner,
                              scope=scope), CacheEntry(plan.version, out, per_row_s))
                   for job in batch.jobs if id(job) in plan.store
                   and (out := row.get(id(job))) is not None
                   and not isinstance(out, BaseException)]
        ttl = plan.ttl_s + self._stale.for_model(model, label or None)
        await self._call(model, "write", self._put(entries, ttl))

    def _answer_twins(self, batch: Batch, run: BatchRun, plan: _Plan,
                      row: dict[int, Any]) -> None:
        copied = [(twin, row[id(src)]) for twin, src in plan.twins if id(src) in row]
        lost = [twin for twin, src in plan.twins if id(src) not in row]
        twin_run = BatchRun([out for _, out in copied], run.started_at, run.compute_s,
                            run.forwards)
        answers, failed = answers_from_run(batch.key.model, plan.version,
                                                  [twin for twin, _ in copied], twin_run)
        for answer in answers:
            answer.result.batch_size = len(batch.jobs)
        batch.answered += answers
        batch.failed += [*failed, *((twin, _LOST) for twin in lost)]
        self._count(batch.key.model, coalesced=len(answers),
                    saved_s=len(answers) * run.compute_s / max(1, len(batch.jobs)))

    # --- the store, never failing a request ----------------------------------------------

    async def _get(self, keys: list[str]) -> list[CacheEntry | None]:
        assert self._cache is not None
        return await self._cache.get_many(keys)

    async def _put(self, entries: list[tuple[str, CacheEntry]], ttl_s: int) -> None:
        assert self._cache is not None
        await self._cache.put_many(entries, ttl_s)

    async def _call(self, model: str, doing: str, call: Awaitable[T]) -> T | None:
        """The store's answer, or None after an error or a timeout (counted, logged once)."""
        try:
            result = await bounded(call, self._timeout_s)
        except (BatchfleetError, TimeoutError) as exc:
            self.counts.errors += 1
            if self._metrics is not None:
                self._metrics.cache_errors.labels(model).inc()
            if not self._failing:
                self._failing = True
                log.warning("result cache unavailable; computing instead (counted in "
                            "batchfleet_cache_errors_total, logged once until it recovers)",
                            doing=doing, model=model, error=str(exc) or type(exc).__name__)
            return None
        if self._failing:
            self._failing = False
            log.info("result cache answering again", model=model)
        return result

    def _count(self, model: str, hits: int = 0, coalesced: int = 0, misses: int = 0,
               saved_s: float = 0.0) -> None:
        c = self.counts
        c.hits, c.coalesced, c.misses = c.hits + hits, c.coalesced + coalesced, c.misses + misses
        c.saved_s += saved_s
        m = self._metrics
        if m is not None:
            for counter, n in ((m.cache_hits, hits), (m.cache_coalesced, coalesced),
                               (m.cache_misses, misses), (m.cache_saved, saved_s)):
                if n:
                    counter.labels(model).inc(n)

    def vitals(self) -> dict[str, Any]:
        c = self.counts
        return {"cache_hits": c.hits, "cache_coalesced": c.coalesced, "cache_misses": c.misses,
                "cache_errors": c.errors, "cache_saved_ms": round(c.saved_s * 1000.0)}


def _hit(job: Job, entry: CacheEntry, now: float) -> Answer:
    """A succeeded result from the cache: no compute, ``cached`` and the version that
    computed it."""
    req = job.request
    job.model_version = entry.model_version
    result = Result(
        request_id=req.request_id, status="succeeded", outputs=entry.outputs, model=req.model,
        model_version=entry.model_version, attempts=req.attempt, enqueued_at=req.enqueued_at,
        started_at=now, finished_at=now,
        queue_ms=max(0.0, (now - req.enqueued_at) * 1000.0) if req.enqueued_at else None,
        compute_ms=0.0, generation=req.generation, owner=req.owner, cached=True)
    return Answer(job.delivery, result, req.notify, req.generation, req.callback_url,
                  req.notify_format)


def result_cache(ttl_s: PerModel[int], metrics: WorkerMetrics | None = None,
                 scope: PerModel[str] = BY_OWNER, *, fallback: frozenset[str] = frozenset(),
                 stale_s: PerModel[int] = NO_STALE) -> list[Middleware]:
    """``[CachedResults]`` when any model has a TTL, else nothing (``defaults.py``)."""
    on = ttl_s.default > 0 or any(ttl > 0 for _, ttl in ttl_s.overrides)
    return ([CachedResults(ttl_s, metrics, scope=scope, fallback=fallback, stale_s=stale_s)]
            if on else [])
