"""``Degrade``: graceful degradation as one middleware (docs/degradation.md).

* start-up: every chain is checked against the models this worker holds (``on_start``)
  and every ``value`` against the model's output for one request (``on_ready``): a chain
  it cannot run stops the worker with one line;
* ``error``: wraps the failure policy (``policy.DegradingPolicy``);
* ``breaker``: the model's lanes keep being pulled while its breaker is open
  (``Guards.draining``) and its batches are answered from the chain here, before
  ``Breakers`` would hold them, skipping a ``model:`` step naming the broken model; the
  half-open probe still runs the model, and its success resumes normal answers;
* one log line when a trigger starts answering for a model and one when the model
  answers again, never one per request; ``batchfleet_degraded_total`` per write won.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.connectors.result_cache import ANY_VERSION, SCOPE_OWNER, cache_key
from batchfleet.connectors.values import CacheEntry
from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.workers.completion import Completed
from batchfleet.workers.fallback.answers import TRIGGER_CAUSES, refuses, unavailable_answer
from batchfleet.workers.fallback.chain import (
    FallbackChain,
    check_chain,
    check_value,
    load_rules,
)
from batchfleet.workers.fallback.policy import DegradingPolicy
from batchfleet.workers.fallback.steps import ChainRunner
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.breakers import Breakers
from batchfleet.workers.middleware.rollout_stats import VersionStats
from batchfleet.workers.models import versions as model_versions
from batchfleet.workers.runner import BatchRun

if TYPE_CHECKING:
    from batchfleet.connectors.control_plane import ResultCache
    from batchfleet.workers.context import WorkerContext
    from batchfleet.workers.failures import FailurePolicy
    from batchfleet.workers.guards import Guards
    from batchfleet.workers.metrics import WorkerMetrics

log = structlog.get_logger("batchfleet.fallback")
#: The window of the ``degraded_rps`` vital.
RATE_WINDOW_S = 10.0
#: A ``cache`` step read slower than this answers nothing (the next step is tried).
CACHE_TIMEOUT_S = 1.0


class Degrade(Middleware):
    def __init__(self, chains: Mapping[str, FallbackChain],
                 triggers: Mapping[str, frozenset[str]], *, cache_on: Mapping[str, bool],
                 metrics: WorkerMetrics | None = None,
                 scopes: Mapping[str, str] | None = None) -> None:
        #: Each model's ``--cache-scope`` (the ``cache`` step reads within it).
        self._scopes = dict(scopes or {})
        #: Models with a chain that answers (a chain of ``fail`` alone changes nothing).
        self.chains = {m: c for m, c in chains.items() if c.active}
        self.triggers = {m: triggers.get(m, frozenset()) for m in self.chains}
        self._cache_on = dict(cache_on)
        self._metrics = metrics
        self.runners: dict[str, ChainRunner] = {}
        self._guards: Guards | None = None
        #: The rollout stats, which count a breaker's degraded answers as the version's errors.
        self._versions: VersionStats | None = None
        #: (model, reason) -> (monotonic start, answers since): for the start/end lines.
        self._active: dict[tuple[str, str], list[float]] = {}
        #: Degraded answers written, per "model:reason": what vitals report.
        self.counts: dict[str, int] = {}
        #: (monotonic, total written) samples over the last ``RATE_WINDOW_S``.
        self._samples: deque[tuple[float, int]] = deque()

    async def _lookup(self, cache: ResultCache, model: str, jobs: Sequence[Job]
                      ) -> list[CacheEntry | None]:
        """The ``cache`` step's read: each job's version-free entry in its cache scope (one
        MGET); a request that opted out of the cache, an error or a timeout: None."""
        scope = self._scopes.get(model, SCOPE_OWNER)
        keys = [cache_key(model, ANY_VERSION, j.request.inputs, owner=j.request.owner,
                          scope=scope) if j.request.cache else None for j in jobs]
        wanted = [k for k in keys if k is not None]
        try:
            found = await asyncio.wait_for(cache.get_many(wanted), CACHE_TIMEOUT_S)
        except (BatchfleetError, TimeoutError) as exc:
            log.warning("fallback cache step could not read the cache", model=model,
                        error=str(exc) or type(exc).__name__)
            return [None] * len(jobs)
        by_key = dict(zip(wanted, found, strict=True))
        return [None if k is None else by_key.get(k) for k in keys]

    def on(self, model: str, trigger: str) -> bool:
        return trigger in self.triggers.get(model, frozenset())

    # --- start-up -------------------------------------------------------------------

    async def on_start(self, ctx: WorkerContext) -> None:
        versions = ctx.versions
        for model, chain in self.chains.items():
            check_chain(model, chain, versions, cache_on=self._cache_on.get(model, False))
            runner = ChainRunner(model, chain, ctx.compute.run_aside,
                                 lambda name, label: _resolve(versions, name, label))
            runner.rules = {s: load_rules(s.arg) for s in chain.steps if s.kind == "rules"}
            if any(s.kind == "cache" for s in chain.steps):
                runner.lookup = partial(self._lookup, ctx.plane.result_cache, model)
            self.runners[model] = runner
        self._versions = ctx.find(VersionStats)
        breakers = ctx.find(Breakers)
        drain = frozenset(m for m in self.chains if self.on(m, "breaker"))
        if breakers is not None and drain:
            self._guards = breakers.guards
            self._guards.draining = drain

    async def on_ready(self, ctx: WorkerContext, warmup_s: dict[str, float]) -> None:
        for model, runner in self.runners.items():
            steps = [s for s in runner.chain.steps if s.kind == "value"]
            if not steps:
                continue
            reference = await _one_output(ctx.handlers[model])
            if reference is None:
                log.info("value fallback taken as given: the model's output is unknown "
                         "(no input spec to run it on)", model=model)
            runner.values = {s: check_value(model, s, reference) for s in steps}

    def failure_policy(self, inner: FailurePolicy) -> FailurePolicy:
        models = frozenset(m for m in self.chains if self.on(m, "error"))
        return DegradingPolicy(inner, models, self._on_errors) if models else inner

    # --- triggers -------------------------------------------------------------------

    async def _on_errors(self, jobs: Sequence[Job], errors: dict[str, ErrorInfo]
                         ) -> tuple[list[Answer], list[Job]]:
        answered: list[Answer] = []
        left: list[Job] = []
        for model, group in _by_model(jobs).items():
            got, rest = await self.degrade(model, group, "error", errors)
            answered += got
            left += rest
        return answered, left

    async def degrade(self, model: str, jobs: Sequence[Job], reason: str,
                      causes: Mapping[str, ErrorInfo] | ErrorInfo, *, cheap_only: bool = False,
                      skip_model: str | None = None) -> tuple[list[Answer], list[Job]]:
        """Answer ``jobs`` of ``model`` from its chain (or fail closed those that refuse a
        fallback): the answers, and the jobs the chain could not answer."""
        now = time.time()
        refusing = [j for j in jobs if refuses(j)]
        willing = [j for j in jobs if not refuses(j)]
        answers = [unavailable_answer(j, reason, _cause(causes, j), now) for j in refusing]
        got, left = await self.runners[model].answer(willing, reason, causes,
                                                     cheap_only=cheap_only,
                                                     skip_model=skip_model)
        if got or answers:
            self._started(model, reason, len(got) + len(answers))
        return answers + got, left

    async def before_compute(self, batch: Batch) -> bool:
        model = batch.key.model
        guards = self._guards
        if guards is None or model not in guards.draining or \
                not guards.answering_around(model):
            return True
        got, left = await self.degrade(model, batch.jobs, "breaker",
                                       TRIGGER_CAUSES["breaker"], skip_model=model)
        if self._versions is not None and got:
            firsts = {j.request.request_id for j in batch.jobs if j.request.attempt <= 1}
            self._versions.count_degraded(
                batch, sum(a.result.request_id in firsts for a in got))
        batch.answered.extend(got)
        batch.jobs = left
        return bool(left)  # the rest go on to Breakers, which holds them as before

    async def after_compute(self, batch: Batch, run: BatchRun) -> None:
        model = batch.key.model
        if any(not isinstance(o, BaseException) for o in run.outputs):
            self._ended(model)

    def after_complete(self, done: Completed) -> None:
        for answer, won in zip(done.answers, done.won, strict=True):
            result = answer.result
            if not (won and result.degraded):
                continue
            key = f"{result.model}:{result.degraded_reason}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if self._metrics is not None:
                self._metrics.degraded.labels(result.model, result.degraded_reason,
                                              result.fallback).inc()

    def vitals(self) -> dict[str, Any]:
        """``degraded`` (counts per model and reason) and ``degraded_rps`` (the column
        ``batchfleet status`` shows), read once per heartbeat."""
        return {"degraded": dict(self.counts), "degraded_rps": round(self.rate(), 2)}

    def rate(self) -> float:
        """Degraded answers written per second over about the last ``RATE_WINDOW_S``."""
        now, total = time.monotonic(), sum(self.counts.values())
        self._samples.append((now, total))
        while len(self._samples) > 1 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        since, before = self._samples[0]
        return (total - before) / (now - since) if now > since else 0.0

    # --- the start and end lines ----------------------------------------------------

    def _started(self, model: str, reason: str, count: int) -> None:
        key = (model, reason)
        state = self._active.get(key)
        if state is None:
            self._active[key] = [time.monotonic(), float(count)]
            log.warning("degradation started: answering from the fallback chain",
                        model=model, reason=reason)
        else:
            state[1] += count

    def _ended(self, model: str) -> None:
        for key in [k for k in self._active if k[0] == model]:
            since, count = self._active.pop(key)
            log.info("degradation ended: the model answers again", model=model,
                     reason=key[1], degraded=int(count),
                     lasted_s=round(time.monotonic() - since, 3))


def _by_model(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    out: dict[str, list[Job]] = {}
    for job in jobs:
        out.setdefault(job.request.model, []).append(job)
    return out


def _cause(causes: Mapping[str, ErrorInfo] | ErrorInfo, job: Job) -> ErrorInfo:
    return causes if isinstance(causes, ErrorInfo) else causes[job.request.request_id]


def _resolve(versions: Mapping[str, Mapping[str, Any]], name: str, label: str | None
             ) -> tuple[str, str]:
    held = versions[name]
    label = label or next(iter(held))
    return (model_versions.version_lane(name, label),
            model_versions.model_version(label, held[label]))


async def _one_output(handler: Any) -> Any:
    """The model's output for one all-zero request, or None when it has no input spec."""
    import numpy as np

    spec = getattr(handler, "input_spec", None)
    if spec is None:
        return None
    sample = np.zeros(spec.shape, dtype=spec.dtype)

    def forward() -> Any:
        return handler.postprocess(handler.predict(handler.preprocess([sample])), 1)[0]

    try:
        return await asyncio.to_thread(forward)
    except Exception as exc:  # a model failing now is what the chain is for: take it as given
        log.info("value fallback taken as given: the model failed on a zero input",
                 error=f"{type(exc).__name__}: {exc}")
        return None


def degrade_middleware(chains: Mapping[str, FallbackChain],
                       triggers: Mapping[str, frozenset[str]], cache_on: Mapping[str, bool],
                       metrics: WorkerMetrics | None,
                       scopes: Mapping[str, str] | None = None) -> list[Middleware]:
    """``[Degrade(...)]`` when some model has a chain that answers; else nothing."""
    if not any(c.active for c in chains.values()):
        return []
    return [Degrade(chains, triggers, cache_on=cache_on, metrics=metrics, scopes=scopes)]
