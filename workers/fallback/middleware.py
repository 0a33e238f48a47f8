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
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.completion import Completed
from batchfleet.workers.fallback.answers import TRIGGER_CAUSES, refuses, unavailable_answer
from batchfleet.workers.fallback.arrivals import Arrivals
from batchfleet.workers.fallback.chain import (
    FallbackChain,
    check_chain,
    check_value,
    load_rules,
)
from batchfleet.workers.fallback.policy import INERT_ONLY, DegradingPolicy
from batchfleet.workers.fallback.steps import ChainRunner, cache_lookup
from batchfleet.workers.intake import Intake
from batchfleet.workers.jobs import Answer, Job
from batchfleet.workers.middleware.base import Batch, Middleware
from batchfleet.workers.middleware.breakers import Breakers
from batchfleet.workers.middleware.result_cache import BY_OWNER, scope_for
from batchfleet.workers.middleware.rollout_stats import VersionStats
from batchfleet.workers.models import versions as model_versions
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.runner import BatchRun
from batchfleet.workers.slo import CostFit

if TYPE_CHECKING:
    from batchfleet.workers.context import WorkerContext
    from batchfleet.workers.failures import FailurePolicy
    from batchfleet.workers.guards import Guards
    from batchfleet.workers.metrics import WorkerMetrics

log = structlog.get_logger("batchfleet.fallback")
#: The window of the ``degraded_rps`` vital.
RATE_WINDOW_S = 10.0
#: ``deadline`` and ``overload`` end (their log line) after this long without firing.
QUIET_S = 1.0


class Degrade(Middleware):
    def __init__(self, chains: Mapping[str, FallbackChain],
                 triggers: Mapping[str, frozenset[str]], *, cache_on: Mapping[str, bool],
                 metrics: WorkerMetrics | None = None,
                 scopes: PerModel[str] | None = None,
                 shed_after_ms: Mapping[str, float | None] | None = None,
                 max_batch_size: int = 64, max_wait_ms: float = 5.0) -> None:
        #: ``--shed-after-ms``: the ``overload`` trigger's mark, per model (None: off).
        self._shed_s = {m: ms / 1000.0 for m, ms in (shed_after_ms or {}).items()
                        if ms is not None}
        self._max_batch, self._max_wait_s = max_batch_size, max_wait_ms / 1000.0
        #: When each fetched job of a shedding model arrived, for the ``overload`` age.
        self._arrivals = Arrivals()
        #: Each model's batch cost against size (``workers/slo.py``), for ``deadline``.
        self._cost: dict[str, CostFit] = {}
        self._in_flight: Callable[[], dict[str, int]] = dict
        #: ``--cache-scope`` (the ``cache`` step reads where the cache writes: per version).
        self._scopes = scopes or BY_OWNER
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
                runner.lookup = cache_lookup(ctx.plane.result_cache, model,
                                             self._scope_of(model, next(iter(versions[model]))))
            self.runners[model] = runner
        if self._metrics is not None:  # each model's degraded share in `status`
            self._metrics.watch_degraded(self.chains)
        self._versions = ctx.find(VersionStats)
        self._in_flight = ctx.in_flight
        breakers = ctx.find(Breakers)
        drain = frozenset(m for m in self.chains if self.on(m, "breaker"))
        if breakers is not None and drain:
            self._guards = breakers.guards
            self._guards.draining = drain

    def _scope_of(self, model: str, first: str) -> Callable[[Job], str]:
        """A job's cache scope as the cache's writes resolve it: by the version label its
        batch computes on (routing's choice, else the model's first version)."""
        return lambda job: scope_for(self._scopes, model, job.version or first)

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
            # A quarantined request may kill whatever computes it: only steps that compute
            # nothing answer it, or a fallback that dies too would loop it forever.
            poison = [j for j in group if errors[j.request.request_id].type in INERT_ONLY]
            rest_of = [j for j in group if errors[j.request.request_id].type not in INERT_ONLY]
            for part, inert in ((rest_of, False), (poison, True)):
                if part:
                    got, rest = await self.degrade(model, part, "error", errors,
                                                   inert_only=inert)
                    answered += got
                    left += rest
        return answered, left

    async def degrade(self, model: str, jobs: Sequence[Job], reason: str,
                      causes: Mapping[str, ErrorInfo] | ErrorInfo, *, cheap_only: bool = False,
                      skip_model: str | None = None, inert_only: bool = False
                      ) -> tuple[list[Answer], list[Job]]:
        """Answer ``jobs`` of ``model`` from its chain (or fail closed those that refuse a
        fallback): the answers, and the jobs the chain could not answer. Under
        ``deadline`` a request that refuses a fallback is left as it is: it expires, as it
        would have without a chain."""
        now = time.time()
        refusing = [j for j in jobs if refuses(j)]
        willing = [j for j in jobs if not refuses(j)]
        answers = ([] if reason == "deadline" else
                   [unavailable_answer(j, reason, _cause(causes, j), now) for j in refusing])
        got, left = await self.runners[model].answer(willing, reason, causes,
                                                     cheap_only=cheap_only,
                                                     skip_model=skip_model,
                                                     inert_only=inert_only)
        if got or answers:
            self._started(model, reason, len(got) + len(answers))
        if reason == "deadline":
            left += refusing
        return answers + got, left

    # --- deadline and overload ------------------------------------------------------

    def predicted_s(self, model: str, ahead: int, size: int | None = None) -> float:
        """Seconds until a request with ``ahead`` others of its model before it finishes:
        the batches ahead and its own, at the cost the model has shown (none learned yet:
        the batching wait alone), plus the batching wait."""
        fit = self._cost.get(model)
        if size is not None:  # its batch is taken: only its compute is left
            return (fit.predict(size) if fit is not None else None) or 0.0
        per_batch = (fit.predict(self._max_batch) if fit is not None else None) or 0.0
        batches = ahead // self._max_batch + 1
        return self._max_wait_s + batches * per_batch

    def _near(self, model: str, jobs: Sequence[Job], now: float, ahead: int,
              size: int | None = None) -> list[Job]:
        """The jobs whose remaining time is below the predicted wait plus compute; the
        ``i``-th of ``jobs`` has ``ahead + i`` requests of its model before it."""
        if not (self.on(model, "deadline") and model in self.runners):
            return []
        return [j for i, j in enumerate(jobs) if j.request.deadline_at is not None
                and j.request.deadline_at - now < self.predicted_s(model, ahead + i, size)]

    async def after_decode(self, intake: Intake) -> None:
        if self._shed_s:
            self._arrivals.note([j for j in intake.jobs if j.request.model in self._shed_s])
        if not any(self.on(m, "deadline") for m in self.runners):
            return
        now, held = time.time(), self._in_flight()
        for model, group in _by_model(intake.jobs).items():
            # fetched and not acked, these included: what is ahead of the first of them
            ahead = max(0, held.get(model, 0) - len(group))
            near = self._near(model, group, now, ahead)
            if not near:
                continue
            got, _ = await self.degrade(model, near, "deadline", TRIGGER_CAUSES["deadline"])
            answered = {id(a.delivery) for a in got}
            intake.answers += got
            intake.jobs = [j for j in intake.jobs if id(j.delivery) not in answered]

    async def on_late(self, jobs: Sequence[Job]) -> tuple[list[Answer], list[Job]]:
        """At the latest at its deadline: a job past it is answered from the chain."""
        answers: list[Answer] = []
        left: list[Job] = []
        for model, group in _by_model(jobs).items():
            if not (self.on(model, "deadline") and model in self.runners):
                left += group
                continue
            got, rest = await self.degrade(model, group, "deadline",
                                           TRIGGER_CAUSES["deadline"])
            answers += got
            left += rest
        return answers, left

    async def _shed(self, batch: Batch) -> None:
        """``deadline``: jobs this batch's compute would finish too late; ``overload``: jobs
        older than ``--shed-after-ms``, answered from the cheap steps (the batch takes
        the oldest first, so the backlog drains back under the mark)."""
        model, now = batch.key.model, time.time()
        near = self._near(model, batch.jobs, now, 0, size=len(batch.jobs))
        if near:
            got, _ = await self.degrade(model, near, "deadline", TRIGGER_CAUSES["deadline"])
            _take(batch, got)
        mark = self._shed_s.get(model)
        if mark is not None and self.on(model, "overload") and batch.jobs:
            ages = self._arrivals.ages_s(batch.jobs)  # our clock, not the producer's
            old = [j for j, age in zip(batch.jobs, ages, strict=True) if age > mark]
            if old:
                got, _ = await self.degrade(model, old, "overload",
                                            TRIGGER_CAUSES["overload"], cheap_only=True)
                _take(batch, got)

    async def before_compute(self, batch: Batch) -> bool:
        model = batch.key.model
        guards = self._guards
        if guards is None or model not in guards.draining or \
                not guards.answering_around(model):
            if model in self.runners:
                await self._shed(batch)
            return bool(batch.jobs)
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
        if model in self.runners and batch.jobs and not run.stalled:
            self._cost.setdefault(model, CostFit()).observe(len(batch.jobs), run.compute_s)
        if run.outputs and not any(isinstance(o, BaseException) for o in run.outputs):
            self._ended(model)  # a whole batch answered by the model

    def after_complete(self, done: Completed) -> None:
        for answer, won in zip(done.answers, done.won, strict=True):
            result = answer.result
            if not (won and result.degraded):
                continue
            key = f"{result.model}:{result.degraded_reason}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if self._metrics is not None:
                self._metrics.on_degraded(result.model, result.degraded_reason or "",
                                          result.fallback)

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
        key, now = (model, reason), time.monotonic()
        state = self._active.get(key)
        if state is None:
            self._active[key] = [now, float(count), now]
            log.warning("degradation started: answering from the fallback chain",
                        model=model, reason=reason)
        else:
            state[1] += count
            state[2] = now

    def _ended(self, model: str) -> None:
        """The model answered a whole batch: ``error`` and ``breaker`` end now;
        ``deadline`` and ``overload`` (the model answers throughout) once quiet for
        ``QUIET_S``."""
        now = time.monotonic()
        for key in [k for k, st in self._active.items() if k[0] == model and (
                k[1] in ("error", "breaker") or now - st[2] > QUIET_S)]:
            since, count, _ = self._active.pop(key)
            log.info("degradation ended: the model answers again", model=model,
                     reason=key[1], degraded=int(count),
                     lasted_s=round(time.monotonic() - since, 3))


def _take(batch: Batch, answers: Sequence[Answer]) -> None:
    """Move answered jobs out of the batch, their answers into ``batch.answered``."""
    answered = {id(a.delivery) for a in answers}
    batch.jobs = [j for j in batch.jobs if id(j.delivery) not in answered]
    batch.answered.extend(answers)


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
                       scopes: PerModel[str] | None = None, **options: Any
                       ) -> list[Middleware]:
    """``[Degrade(...)]`` when some model has a chain that answers; else nothing.
    ``options``: ``shed_after_ms``, ``max_batch_size``, ``max_wait_ms``."""
    if not any(c.active for c in chains.values()):
        return []
    return [Degrade(chains, triggers, cache_on=cache_on, metrics=metrics, scopes=scopes,
                    **options)]
