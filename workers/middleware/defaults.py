"""The production middleware list, built once from the settings at the entry point."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from batchfleet.connectors.tracing import tracer as otel_tracer
from batchfleet.schemas.names import Names
from batchfleet.workers.breaker import BreakerConfig
from batchfleet.workers.fallback.middleware import degrade_middleware
from batchfleet.workers.guards import Guards
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.base import Chain, Middleware
from batchfleet.workers.middleware.breakers import Breakers
from batchfleet.workers.middleware.cancels import CancelledDrop
from batchfleet.workers.middleware.fleet import HeartbeatLoop, RetryPumpLoop
from batchfleet.workers.middleware.health import HealthEndpoint
from batchfleet.workers.middleware.leases import LeaseKeeper
from batchfleet.workers.middleware.metrics import Metrics
from batchfleet.workers.middleware.output_stats import OutputStats
from batchfleet.workers.middleware.pauses import OperatorPauses
from batchfleet.workers.middleware.pipelines import PipelineAdvance
from batchfleet.workers.middleware.quarantine import Quarantine
from batchfleet.workers.middleware.repository import repository_watch
from batchfleet.workers.middleware.request_log import RequestLog
from batchfleet.workers.middleware.residency import model_residency
from batchfleet.workers.middleware.result_cache import result_cache
from batchfleet.workers.middleware.rollout_guard import RolloutGuard
from batchfleet.workers.middleware.rollout_stats import PolicyCache, VersionStats
from batchfleet.workers.middleware.routing import Routing
from batchfleet.workers.middleware.shadow import Shadow
from batchfleet.workers.middleware.slo import slo_batching
from batchfleet.workers.middleware.stats import Stats
from batchfleet.workers.middleware.stuck import StuckCompute
from batchfleet.workers.middleware.tracing import Tracing
from batchfleet.workers.middleware.webhooks import Webhooks
from batchfleet.workers.settings import WorkerSettings
from batchfleet.workers.stats import WorkerStats
from batchfleet.workers.webhooks import RQCallbackSink

M = TypeVar("M", bound=Middleware)


def default_middleware(settings: WorkerSettings, models: Iterable[str]) -> list[Middleware]:
    """Order matters where hooks meet: the health port binds first (the cheapest start-up
    check); leases hold a delivery before anything else sees it; the breakers decide
    before quarantine notes a suspect's solo run (a held batch is not running)."""
    s = settings
    breaker = BreakerConfig(consecutive_failures=s.breaker_failures,
                            cooldown_s=s.breaker_cooldown_s)
    guards = Guards(breaker, breaker, models)
    stats, metrics = Stats(), WorkerMetrics()
    chain: list[Middleware] = []
    pipelines = PipelineAdvance(metrics)
    if s.metrics_port is not None:
        chain.append(HealthEndpoint(s.metrics_host, s.metrics_port, metrics.exposition))
    served = list(models)
    cache_on = {m: s.cache_ttl_s.for_model(m) > 0 for m in served}
    chains = s.fallback_chains(served)
    chain += [LeaseKeeper(s.claim_idle_ms), stats, CancelledDrop(),
              # before Breakers: it answers an open breaker's batches from the chain
              *degrade_middleware(chains, s.degrade_triggers(served), cache_on, metrics,
                                 s.cache_scope,
                                 shed_after_ms={m: s.shed_after_ms.for_model(m)
                                                for m in served},
                                 max_batch_size=s.max_batch_size, max_wait_ms=s.max_wait_ms),
              Breakers(guards), OperatorPauses(), *model_residency(s, metrics),
              *repository_watch(s),
              StuckCompute(s.stuck_exit_s),
              Quarantine(s.quarantine_after, stats.stats), Routing(),
              # after Routing (key: version)
              *result_cache(s.cache_ttl_s, metrics, s.cache_scope, stale_s=s.cache_stale_s,
                            fallback=frozenset(m for m, c in chains.items()
                                               if any(st.kind == "cache" for st in c.steps))),
              *slo_batching(s.latency_slo_ms, s.max_batch_size, s.max_wait_ms, metrics),
              Metrics(metrics, guards, s.sample_every_s), RequestLog(), pipelines,
              HeartbeatLoop(),
              RetryPumpLoop()]
    policies = PolicyCache()  # rollout: per-version stats, shadow runs, the guard
    versions = VersionStats(metrics, policies)
    # what each version answers (docs/monitoring.md); the guard's output evidence
    outputs = (OutputStats(s.output_kind, s.stats_window_s, s.stats_keep_s, metrics=metrics)
               if s.output_stats else None)
    chain += [versions, Shadow(metrics, policies, versions, budget=s.shadow_budget),
              RolloutGuard(metrics, policies, evidence=outputs)]
    if outputs is not None:
        chain.append(outputs)
    tracer = otel_tracer("batchfleet-worker")  # None unless OTEL_* turned tracing on
    tracing = None if tracer is None else Tracing(tracer)
    if s.webhooks:
        webhooks = Webhooks(RQCallbackSink(
            s.webhook_redis_url or s.results_url, Names(s.namespace),
            retry_intervals=s.webhook_retry_intervals, keep_s=s.result_ttl_s,
            traceparent_of=None if tracing is None else tracing.traceparent_of))
        chain.append(webhooks)
        pipelines.callbacks = webhooks.sink.enqueue  # a pipeline's result, for its caller
    if tracing is not None:  # last: its compute span spans the others' after_compute
        chain.append(tracing)
    return chain


class DefaultViews:
    """The default middleware's state, read straight off the worker (tests, embedders)."""

    hooks: Chain

    def find(self, kind: type[M]) -> M:
        """The middleware of a kind (``LookupError`` when the list has none)."""
        if (found := self.hooks.find(kind)) is None:
            raise LookupError(f"this worker runs no {kind.__name__} middleware")
        return found

    @property
    def guards(self) -> Guards:
        return self.find(Breakers).guards

    @property
    def metrics(self) -> WorkerMetrics:
        return self.find(Metrics).metrics

    @property
    def stats(self) -> WorkerStats:
        return self.find(Stats).stats
