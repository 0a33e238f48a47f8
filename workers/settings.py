"""Worker settings: one frozen dataclass, built once at the entry point.

Nothing below the CLI reads the environment. Each field is declared once, here, with
its default and an ``opt()`` in its metadata (the machinery: ``schemas/settings.py``;
the connection options every command shares are declared there); from those the CLI
generates the
``batchfleet worker`` option, the ``BATCHFLEET_*`` variable, the ``--help`` line, the
``--print-config`` line and the README's configuration table, so a default is written
nowhere else. Precedence: a flag wins over the variable, the variable over the default.

Naming: field ``max_wait_ms`` is ``--max-wait-ms`` and ``BATCHFLEET_MAX_WAIT_MS``. A
field holding a nested settings dataclass (``kafka: KafkaSettings``) prefixes its
children: ``kafka.partitions`` is ``--kafka-partitions`` and ``BATCHFLEET_KAFKA_PARTITIONS``.
Keep these names stable: infra/ and docs use them (tests/unit/test_settings.py checks).

**Adding a setting**: a field with a default and ``metadata=opt("help, saying why.")``.
The value type picks the parser (``int``, ``float``, ``str``, ``bool``, ``X | None``
where an empty value or ``none`` means None, ``tuple[int, ...]`` as ``1,2,3``); give
``opt(parse=...)`` for anything else. Validate it in :meth:`WorkerSettings.validated`.

**Per-model settings** (see ``schemas/per_model.py``): type the field ``PerModel[T]``,
default ``PerModel(<default for every model>)``, and mark it ``opt(..., per_model=True)``::

    runtime: PerModel[str] = field(default=PerModel("eager"), metadata=opt(
        "How models run: eager or compile.", per_model=True, metavar="RUNTIME"))

The CLI then takes ``--runtime compile`` (every model) and, repeatable,
``--runtime MODEL=VALUE`` or ``--runtime MODEL@VERSION=VALUE`` (one model; the most
specific wins); the variable takes the same entries comma-separated
(``BATCHFLEET_RUNTIME="compile,demo-encoder=eager"``). Overrides naming a model the
worker does not serve are refused at start-up. Code reads
``settings.runtime.for_model(name, version)``; validate values in ``opt(parse=...)``
(raise ``ValueError`` with a message) or in :meth:`WorkerSettings.validated`.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.schemas.errors import ConfigError, ValidationError
from batchfleet.schemas.names import MAX_LANE_SHARDS
from batchfleet.schemas.settings import (
    APP_DIR,
    BROKER,
    DEFAULT_NAMESPACE,
    ENV_PREFIX,
    NAMESPACE,
    RESULTS,
    Opt,
    SettingOption,
    build,
    format_value,
    one_of,
    opt,
    setting_options,
    truth,
    type_parser,
    with_opt,
)
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.workers.compute_limits import parse_limit
from batchfleet.workers.per_model import PerModel

#: The machinery lives in ``schemas/settings.py``; these names stay importable from here.
__all__ = ["ENV_PREFIX", "KafkaSettings", "Opt", "ProcessSettings", "SettingOption",
           "WorkerSettings", "build", "format_value", "opt", "setting_options", "type_parser"]


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _check_retry(spec: str) -> str:
    from batchfleet.workers.retry import RetryConfig

    RetryConfig.parse(spec, RetryConfig())
    return spec


def _check_chain(text: str) -> str:
    from batchfleet.workers.fallback.chain import check_chain_text

    return check_chain_text(text)


def _check_triggers(text: str) -> str:
    from batchfleet.workers.fallback.chain import check_triggers_text

    return check_triggers_text(text)


def _tolerance(value: str) -> float | None:
    if value.lower() in ("", "none", "default"):
        return None
    tolerance = float(value)
    if tolerance < 0:
        raise ValueError("must not be negative")
    return tolerance


def _cache_ttl(value: str) -> int:
    ttl = int(value) if value.strip().isdigit() else -1
    if ttl < 0:
        raise ValueError("expected whole seconds, 0 or more (0: no cache)")
    return ttl


def _output_kind(value: str) -> str | None:
    from batchfleet.connectors.output_summary import KINDS

    if value.lower() in ("", "none", "guess", "guessed"):
        return None
    if value not in KINDS:
        raise ValueError(f"expected one of {', '.join(KINDS)}")
    return value


def _positive_int(value: str) -> int:
    n = int(value) if value.strip().isdigit() else 0
    if n < 1:
        raise ValueError("expected a whole number of seconds, 1 or more")
    return n


def _shard_count(value: str) -> int:
    count = int(value) if value.strip().lstrip("-").isdigit() else -1
    if not 1 <= count <= MAX_LANE_SHARDS:
        raise ValueError(f"expected a whole number from 1 to {MAX_LANE_SHARDS}")
    return count


def _input_spec(value: str) -> str:
    if value.strip().lower() in ("", "none"):
        return ""
    try:
        spec = TensorSpec.parse(value)
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    return f"{spec.dtype}[{','.join(map(str, spec.shape))}]"  # as typed on the command line


def _slo_ms(value: str) -> float | None:
    if value.lower() in ("", "none", "off"):
        return None
    try:
        ms = float(value)
    except ValueError:
        raise ValueError("expected milliseconds (a positive number) or none") from None
    if not 0 < ms < float("inf"):
        raise ValueError("must be a positive number of milliseconds")
    return ms


def _non_negative_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise ValueError("expected milliseconds, 0 or more") from None
    if not 0 <= ms < float("inf"):
        raise ValueError("expected milliseconds, 0 or more")
    return ms


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Settings only a Kafka broker uses (``kafka://``); a Redis worker ignores them."""

    #: Partitions of the topics this worker creates (its fleet's useful scale-out).
    partitions: int = field(default=4, metadata=opt(
        "Partitions of topics this worker creates: the most workers a lane can use."))
    #: A dead Kafka member's partitions move after this long (and Tansu holds joins for half).
    session_timeout_ms: int = field(default=10_000, metadata=opt(
        "A dead worker's partitions move to the others after this long."))


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    broker: BrokerURL = field(metadata=with_opt(BROKER, parse=BrokerURL.parse,
                                                panel="Connection"))
    results_url: str = field(metadata=with_opt(RESULTS, panel="Connection"))
    models: tuple[str, ...] = field(default=("demo-mlp",), metadata=opt(
        "Model to serve, repeatable: demo-mlp, demo-encoder, NAME=module:factory or "
        "NAME=path.pt; NAME@VERSION=SPEC adds a version (demo-mlp@v2=demo-mlp:seed=2).",
        flag="--model", short="-m", metavar="SPEC", repeat=True,
        panel="Connection"))
    #: Where ``module:factory`` specs are imported from ("": the working directory).
    app_dir: str = field(default="", metadata=with_opt(
        APP_DIR, show="the working directory", panel="Connection"))
    #: Per model: the dtype and per-request shape a model takes, for a plain module or a
    #: .pt/.pt2 file that cannot say; a request that does not match fails at intake.
    input_spec: PerModel[str] = field(default=PerModel(""), metadata=opt(
        "What a model takes per request, e.g. float32[3,224,224]: a request that does not "
        "match fails at once as a validation_error (docs/models.md).", per_model=True,
        metavar="[MODEL=]DTYPE[SHAPE]", parse=_input_spec, show="the model's own",
        panel="Connection"))
    device: str = field(default="auto", metadata=opt("auto, cpu, cuda or cuda:N."))
    #: A batch closes at this many requests...
    max_batch_size: int = field(default=64, metadata=opt(
        "A batch closes at this size...", panel="Batching"))
    #: ...or when its oldest request has waited this long.
    max_wait_ms: float = field(default=5.0, metadata=opt(
        "...or when its oldest request has waited this long.", panel="Batching"))
    #: Per model: close batches as late as this fleet-side latency SLO (enqueued_at to
    #: finished_at) allows, learnt from compute cost and arrival rate (workers/slo.py),
    #: instead of after max_wait_ms. None: the fixed wait.
    latency_slo_ms: PerModel[float | None] = field(default=PerModel(None), metadata=opt(
        "Latency SLO from enqueue to finished: close each batch as late as it allows "
        "(learning compute time and arrival rate) instead of --max-wait-ms. See "
        "docs/batching.md.", per_model=True, metavar="[MODEL=]MS", parse=_slo_ms,
        show="off", panel="Batching"))
    #: How many batches' worth of requests may wait in memory ahead of compute.
    prefetch_batches: int = field(default=2, metadata=opt(
        "Batches' worth of requests that may wait in memory ahead of compute.",
        panel="Batching"))
    fetch_timeout_ms: int = field(default=100, metadata=opt(
        "How long one broker read blocks when nothing is waiting.", panel="Batching"))
    #: Pending entries idle this long belong to a crashed consumer and are reclaimed.
    claim_idle_ms: int = field(default=60_000, metadata=opt(
        "Redis: reclaim other consumers' entries idle this long (they crashed).",
        transport="redis"))
    #: Split a model's lanes into K streams (shard 0 is today's); give every worker of the
    #: model the same K. Kept in the model registry; Kafka refuses more than 1.
    lane_shards: PerModel[int] = field(default=PerModel(1), metadata=opt(
        "Split each lane of a model into this many Redis streams, so a hot model is not "
        "bound to one stream (docs/operations.md, \"Sharded lanes\").", per_model=True,
        metavar="[MODEL=]K", parse=_shard_count, transport="redis"))
    result_ttl_s: int = field(default=DEFAULT_TTL_S, metadata=opt("How long results are kept."))
    #: Result cache (docs/cache.md): repeats of the same inputs on the same model version
    #: are answered from a stored output for this long; 0: off.
    cache_ttl_s: PerModel[int] = field(default=PerModel(0), metadata=opt(
        "Answer repeated inputs from a result cache kept this long (0: off); the key holds "
        "the model version (docs/cache.md).", per_model=True, metavar="[MODEL=]SECONDS",
        parse=_cache_ttl))
    #: Graceful degradation (docs/degradation.md): the fallback ``cache`` step's version-free
    #: entries live this much longer than --cache-ttl-s, read only as fallbacks.
    cache_stale_s: PerModel[int] = field(default=PerModel(0), metadata=opt(
        "Keep the fallback cache step's entries this much longer than --cache-ttl-s, for "
        "fallback answers only (stale-if-error; docs/degradation.md).", per_model=True,
        metavar="[MODEL=]SECONDS", parse=_cache_ttl))
    #: Whose requests share cache entries: each owner its own (API key ID, SDK ``owner=``),
    #: or everyone (a hit then tells a caller someone else sent those inputs; docs/cache.md).
    cache_scope: PerModel[str] = field(default=PerModel("owner"), metadata=opt(
        "Who shares result-cache entries: owner (each API key / SDK owner its own) or shared "
        "(everyone: reveals what others sent; docs/cache.md).", per_model=True,
        metavar="[MODEL[@VERSION]=]owner|shared", parse=one_of("owner", "shared")))
    #: Rollout shadows (docs/rollout.md): the share of wall time each model's shadow forwards
    #: may take on their own thread (0: never; none: no limit); a batch over it is skipped.
    shadow_budget: PerModel[float | None] = field(default=PerModel(0.25), metadata=opt(
        "Share of wall time a model's shadow version may run (0 to 1; none: no limit); "
        "batches over it are not shadowed (docs/rollout.md).", per_model=True,
        metavar="[MODEL=]FRACTION", parse=_tolerance, show="0.25"))
    #: On SIGTERM, in-flight work gets this long to finish before the worker exits anyway.
    grace_s: float = field(default=30.0, metadata=opt(
        "On SIGTERM, how long in-flight work may take to finish."))
    namespace: str = field(default=DEFAULT_NAMESPACE,
                           metadata=with_opt(NAMESPACE, panel="Connection"))
    #: Transport-specific settings: --kafka-partitions, --kafka-session-timeout-ms.
    kafka: KafkaSettings = field(default=KafkaSettings(), metadata=opt(
        "Kafka only.", transport="kafka"))
    max_message_bytes: int = field(default=16 * 1024 * 1024, metadata=opt(
        "Largest request message accepted; larger ones fail as invalid."))
    #: Result writes in flight at once; beyond that compute waits (backpressure).
    max_pending_writes: int = field(default=4, metadata=opt(
        "Result writes in flight at once; beyond that compute waits (backpressure).",
        panel="Batching"))
    #: Retries: attempts in all (1 = no retry), full-jitter backoff base and cap.
    max_attempts: int = field(default=3, metadata=opt(
        "Attempts per request (1 = no retry) before the DLQ.", panel="Failures"))
    retry_base_s: float = field(default=0.5, metadata=opt(
        "Backoff base (full jitter).", panel="Failures"))
    retry_cap_s: float = field(default=30.0, metadata=opt("Backoff cap.", panel="Failures"))
    #: Per-model retry policy "ATTEMPTS[:BASE_S[:CAP_S]]"; "" means the three settings above.
    retry: PerModel[str] = field(default=PerModel(""), metadata=opt(
        "Retry policy ATTEMPTS[:BASE_S[:CAP_S]], e.g. demo-encoder=5:0.2:10.",
        per_model=True, metavar="[MODEL=]ATTEMPTS[:BASE[:CAP]]", parse=_check_retry,
        show="--max-attempts:--retry-base-s:--retry-cap-s", panel="Failures"))
    #: A request redelivered after its worker died is a suspect and runs alone; after this
    #: many solo runs that also died, it is quarantined to the DLQ instead of run again.
    quarantine_after: int = field(default=3, metadata=opt(
        "Quarantine a request to the DLQ after this many deliveries that died.",
        panel="Failures"))
    #: A batch computing longer than this is split, its hanging request quarantined
    #: (workers/containment.py); None (auto): learned per model (workers/compute_limits.py).
    compute_timeout_s: PerModel[float | None] = field(default=PerModel(None), metadata=opt(
        "Seconds a batch may compute before it is split and retried, and a request that "
        "stalls twice is quarantined; auto (or none): 10x the model's p99 batch time, at "
        "least 10 s (120 s before 5 batches).", per_model=True, metavar="[MODEL=]S|auto",
        parse=parse_limit, show="auto", panel="Failures"))
    #: A compute thread still stuck this long after its batch was abandoned: the worker
    #: drains and exits with EXIT_STUCK (75) for its supervisor to restart it.
    stuck_exit_s: float = field(default=120.0, metadata=opt(
        "A compute thread stuck this long past its limit makes the worker drain and exit "
        "75, for its supervisor to restart it.", panel="Failures"))
    #: Graceful degradation (docs/degradation.md): steps tried in turn when the model cannot
    #: answer; "" (fail) changes nothing.
    fallback: PerModel[str] = field(default=PerModel(""), metadata=opt(
        "Fallback chain, steps joined with '|' (quote it): cache, model:NAME[@VERSION], "
        "rules:module:function, value:JSON, fail. Answers are marked degraded "
        "(docs/degradation.md).", per_model=True, metavar="[MODEL=]CHAIN",
        parse=_check_chain, show="fail", panel="Failures"))
    #: The ``overload`` trigger: requests older than this are answered from the chain's cheap
    #: steps (cache, rules, value) instead of waiting; None: off.
    shed_after_ms: PerModel[float | None] = field(default=PerModel(None), metadata=opt(
        "Overload: requests that waited longer than this are answered from the fallback "
        "chain's cheap steps (cache, rules, value) until the backlog is back under it "
        "(docs/degradation.md).", per_model=True, metavar="[MODEL=]MS", parse=_slo_ms,
        show="off", panel="Failures"))
    degrade_on: PerModel[str] = field(default=PerModel("all"), metadata=opt(
        "When a fallback chain answers: error, breaker, deadline, overload joined with '+' "
        "(or all, none).", per_model=True, metavar="[MODEL=]TRIGGERS",
        parse=_check_triggers, panel="Failures"))
    #: Circuit breakers: trip after this many failures in a row, probe after the cooldown.
    breaker_failures: int = field(default=5, metadata=opt(
        "Circuit breakers open after this many failures in a row.", panel="Failures"))
    breaker_cooldown_s: float = field(default=5.0, metadata=opt(
        "Seconds open before a half-open probe.", panel="Failures"))
    #: Serve /metrics, /healthz and /readyz here (None: off; 0: any free port).
    metrics_port: int | None = field(default=None, metadata=opt(
        "Serve /metrics, /healthz and /readyz on this port (none: off; 0: any free port).",
        panel="Observability"))
    metrics_host: str = field(default="0.0.0.0", metadata=opt(
        "Address the metrics port binds.", panel="Observability"))
    #: How often backlog, DLQ size and breaker gauges are refreshed.
    sample_every_s: float = field(default=5.0, metadata=opt(
        "How often backlog, DLQ size and breaker gauges are refreshed.", panel="Observability"))
    #: Output and input statistics per model version (docs/monitoring.md): on by default.
    output_stats: bool = field(default=True, metadata=opt(
        "Keep output and input statistics per model version (docs/monitoring.md).",
        panel="Observability"))
    #: What a model's outputs are, for their statistics; none: guessed from the first output
    #: (integers: classes; one float: regression; up to 32 floats: scores; more: embedding).
    output_kind: PerModel[str | None] = field(default=PerModel(None), metadata=opt(
        "What the outputs are: scores (arg-max class shares counted), classes, regression "
        "or embedding (norm and first 8 elements); default guessed from the output "
        "(docs/monitoring.md).", per_model=True,
        metavar="[MODEL=]scores|classes|regression|embedding", parse=_output_kind,
        show="guessed", panel="Observability"))
    stats_window_s: int = field(default=60, metadata=opt(
        "Length of the time windows output statistics are merged into.",
        parse=_positive_int, panel="Observability"))
    stats_keep_s: int = field(default=24 * 3600, metadata=opt(
        "How long output-statistics windows are kept.", parse=_positive_int,
        panel="Observability"))
    worker_id: str = field(default_factory=default_worker_id, metadata=opt(
        "Consumer name. Keep it stable across restarts to resume a Redis consumer's pending "
        "entries at once.", show="host-pid-random", panel="Connection"))
    #: Enqueue a webhook delivery (RQ) for every terminal result with a callback_url.
    webhooks: bool = field(default=True, metadata=opt(
        "Enqueue a webhook delivery (RQ) for every terminal result with a callback_url.",
        panel="Webhooks"))
    #: Redis holding the RQ webhook queue; None: the result store's.
    webhook_redis_url: str | None = field(default=None, metadata=opt(
        "Redis holding the RQ webhook queue.", metavar="URL", show="the result store's",
        panel="Webhooks"))
    #: Seconds between delivery attempts, one per retry (RQ aligns the list from its end).
    webhook_retry_intervals: tuple[int, ...] = field(
        default=(5, 30, 120, 600, 1800, 3600, 3600), metadata=opt(
            "Seconds between webhook delivery attempts, comma-separated, one per retry.",
            metavar="S,S,...", panel="Webhooks"))
    # --- Runtimes (issue 16): how each model executes; workers/models/runtimes.py ---------
    runtime: PerModel[str] = field(default=PerModel("eager"), metadata=opt(
        "How a model runs: eager, compile (torch.compile, warmed per batch bucket) or onnx "
        "(ONNX Runtime). See docs/runtimes.md.", per_model=True, metavar="[MODEL=]RUNTIME",
        parse=one_of("eager", "compile", "onnx"), panel="Runtimes"))
    precision: PerModel[str] = field(default=PerModel("fp32"), metadata=opt(
        "fp32, bf16 (eager/compile), fp16 (CUDA) or int8 (onnx). Part of model_version.",
        per_model=True, metavar="[MODEL=]PRECISION",
        parse=one_of("fp32", "bf16", "fp16", "int8"), panel="Runtimes"))
    #: ``.npy`` rows the accuracy gate compares on; "" means 256 seeded random rows.
    calibration: PerModel[str] = field(default=PerModel(""), metadata=opt(
        "A .npy batch of inputs the accuracy gate compares on (default: 256 seeded rows).",
        per_model=True, metavar="[MODEL=]FILE", show="seeded rows", panel="Runtimes"))
    #: Max-abs difference from eager fp32 allowed, in units of the reference outputs' std;
    #: None: the precision's default (docs/runtimes.md).
    accuracy_tolerance: PerModel[float | None] = field(default=PerModel(None), metadata=opt(
        "Largest max-abs difference from eager fp32 allowed, as a fraction of the outputs' "
        "std.", per_model=True, metavar="[MODEL=]FRACTION", parse=_tolerance,
        show="per precision", panel="Runtimes"))
    accept_accuracy_loss: PerModel[bool] = field(default=PerModel(False), metadata=opt(
        "Start even when the accuracy gate measures a difference past the tolerance.",
        per_model=True, metavar="[MODEL=]true|false", parse=truth, panel="Runtimes"))

    #: A model repository (docs/models.md, "Model repository"), polled for new versions.
    model_repository: str = field(default="", metadata=opt(
        "Serve every model of this repository (a directory or s3://bucket/prefix: one "
        "folder per model with a model.toml, one subfolder per version, complete once it "
        "holds READY).", metavar="DIR|URL", show="none", panel="Loading"))
    repository_poll_s: float = field(default=10.0, metadata=opt(
        "How often the model repository is read for new and removed versions.",
        panel="Loading"))
    #: Loading on demand (docs/models.md, "Loading on demand"): hold at most this many
    #: models, or this much of their memory; the others' lanes are paused until loaded.
    max_loaded_models: int | None = field(default=None, metadata=opt(
        "Hold at most this many models in memory; the others wait in their lanes and are "
        "loaded when they have work, evicting the least recently used idle one "
        "(docs/models.md).", metavar="K", show="all", panel="Loading"))
    model_memory_mb: float | None = field(default=None, metadata=opt(
        "Hold models up to this much memory (parameters and buffers; CUDA memory on a "
        "GPU), loading and evicting as --max-loaded-models does.", metavar="MB",
        show="no limit", panel="Loading"))
    min_residency_s: float = field(default=10.0, metadata=opt(
        "A loaded model is not evicted for this long after loading (no thrash).",
        panel="Loading"))
    cold_load_after_ms: PerModel[float] = field(default=PerModel(0.0), metadata=opt(
        "Load a model this worker does not hold only once its lane's oldest request has "
        "waited this long, so workers that hold it read it first.", per_model=True,
        metavar="[MODEL=]MS", parse=_non_negative_ms, panel="Loading"))

    @classmethod
    def from_url(cls, broker: str, results: str | None = None, **overrides: Any) -> WorkerSettings:
        parsed = BrokerURL.parse(broker)
        settings = cls(broker=parsed, results_url=results_url_for(parsed, results))
        return settings.replace(**overrides) if overrides else settings.validated()

    def replace(self, **changes: Any) -> WorkerSettings:
        """Change fields; ``kafka_partitions=8`` reaches ``kafka.partitions`` (flag names)."""
        kafka = {name.removeprefix("kafka_"): changes.pop(name)
                 for name in list(changes) if name.startswith("kafka_")}
        if kafka:
            changes["kafka"] = replace(changes.get("kafka", self.kafka), **kafka)
        return replace(self, **changes).validated()

    # The flat names the worker and tests have always used.
    @property
    def kafka_partitions(self) -> int:
        return self.kafka.partitions

    @property
    def kafka_session_timeout_ms(self) -> int:
        return self.kafka.session_timeout_ms

    @property
    def model_names(self) -> tuple[str, ...]:
        """Served model names: a spec's part before ``=`` (``fraud=mypkg.models:build``)."""
        return tuple(dict.fromkeys(spec.partition("=")[0].partition("@")[0].strip()
                                   for spec in self.models))

    @property
    def on_demand(self) -> bool:
        """Whether models are loaded on demand (a count or a memory budget is set)."""
        return self.max_loaded_models is not None or self.model_memory_mb is not None

    @property
    def lane_shards_by_model(self) -> dict[str, int]:
        """Served model -> its ``--lane-shards`` K (what the worker asserts in the registry)."""
        return {m: self.lane_shards.for_model(m) for m in self.model_names}

    @property
    def retry_overrides(self) -> tuple[tuple[str, str], ...]:
        """(model, "ATTEMPTS[:BASE_S[:CAP_S]]") for each served model whose --retry is set."""
        resolved = ((m, self.retry.for_model(m)) for m in self.model_names)
        return tuple((m, spec) for m, spec in resolved if spec)

    def retry_for(self, model: str, version: str | None = None) -> Any:
        """The model's ``RetryConfig``: its --retry entry on top of the three defaults."""
        from batchfleet.workers.retry import RetryConfig

        default = RetryConfig(self.max_attempts, self.retry_base_s, self.retry_cap_s)
        spec = self.retry.for_model(model, version)
        return RetryConfig.parse(spec, default) if spec else default

    def input_spec_for(self, model: str, version: str | None = None) -> TensorSpec | None:
        """The model's ``--input-spec`` as a ``TensorSpec``, or None where not given."""
        text = self.input_spec.for_model(model, version)
        return TensorSpec.parse(text) if text else None

    def fallback_chains(self, models: Iterable[str]) -> dict[str, Any]:
        """Each served model's ``FallbackChain`` (``workers/fallback/chain.py``)."""
        from batchfleet.workers.fallback.chain import parse_chain

        return {m: parse_chain(self.fallback.for_model(m)) for m in models}

    def degrade_triggers(self, models: Iterable[str]) -> dict[str, frozenset[str]]:
        """Each served model's triggers its chain answers (``--degrade-on``)."""
        from batchfleet.workers.fallback.chain import parse_triggers

        return {m: parse_triggers(self.degrade_on.for_model(m)) for m in models}

    def runtime_for(self, model: str, version: str | None = None) -> Any:
        """The model's ``RuntimeChoice``: runtime, precision and its accuracy gate."""
        from pathlib import Path

        from batchfleet.workers.models.runtimes import RuntimeChoice

        calibration = self.calibration.for_model(model, version)
        return RuntimeChoice(self.runtime.for_model(model, version),
                             self.precision.for_model(model, version),
                             Path(calibration) if calibration else None,
                             self.accept_accuracy_loss.for_model(model, version),
                             self.accuracy_tolerance.for_model(model, version))

    def validated(self) -> WorkerSettings:
        if self.max_batch_size < 1:
            raise ConfigError("max_batch_size must be at least 1")
        if self.max_wait_ms < 0:
            raise ConfigError("max_wait_ms must not be negative")
        if self.prefetch_batches < 1:
            raise ConfigError("prefetch_batches must be at least 1")
        if self.grace_s <= 0:
            raise ConfigError("grace_s must be positive")
        if not self.models:
            raise ConfigError("at least one --model is needed")
        if self.max_attempts < 1 or self.quarantine_after < 1 or self.breaker_failures < 1:
            raise ConfigError("max_attempts, quarantine_after and breaker_failures must be >= 1")
        if any(i < 0 for i in self.webhook_retry_intervals):
            raise ConfigError("webhook_retry_intervals must not be negative")
        rq_url = self.webhook_redis_url or self.results_url
        if self.webhooks and rq_url.partition("://")[0].lower() not in ("redis", "rediss", "unix",
                                                                        "redis+cluster"):
            raise ConfigError("webhooks queue on Redis (RQ): pass --webhook-redis-url "
                              f"redis://host:port/db for a {rq_url.partition(':')[0]}:// "
                              "result store, or --no-webhooks")
        if self.max_loaded_models is not None and self.max_loaded_models < 1:
            raise ConfigError("max_loaded_models must be at least 1")
        if self.model_memory_mb is not None and self.model_memory_mb <= 0:
            raise ConfigError("model_memory_mb must be positive")
        if self.repository_poll_s <= 0:
            raise ConfigError("repository_poll_s must be positive")
        if self.min_residency_s < 0:
            raise ConfigError("min_residency_s must not be negative")
        if self.stuck_exit_s <= 0:
            raise ConfigError("stuck_exit_s must be positive")
        for option in setting_options(WorkerSettings):
            if option.opt.per_model:
                option.get(self).check_models(self.model_names, option.flag)
        for name in ("fallback", "degrade_on", "shed_after_ms"):  # per model, not per version
            versioned = [f"{m}@{v}" for (m, v), _ in getattr(self, name).overrides if v]
            if versioned:
                raise ConfigError(f"--{name.replace('_', '-')} {versioned[0]}=...: a chain is "
                                  "per model, not per version (docs/degradation.md)")
        sharded = [m for m in self.model_names if self.lane_shards.for_model(m) > 1]
        if self.broker.kind == "kafka" and sharded:
            raise ConfigError(f"--lane-shards is for Redis Streams only ({', '.join(sharded)}): "
                              "a Kafka lane scales by partitions (--kafka-partitions)")
        return self


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """What the ``worker`` entry point sets up before a ``Worker`` exists."""

    log_format: str = field(default="auto", metadata=opt(
        "auto (console on a TTY), json or console.", panel="Process"))
    log_level: str = field(default="info", metadata=opt(
        "debug, info, warning, error or critical; debug logs every batch with its request "
        "IDs.", panel="Process"))
    debug: bool = field(default=False, metadata=opt(
        "On a start-up or fatal error, show the full traceback, not just one line.",
        panel="Process"))
    torch_threads: int | None = field(default=None, metadata=opt(
        "torch intra-op threads (default: torch's, one per core). Small models run faster "
        "with 1 when the worker shares its cores (docs/performance.md). A waiting OpenMP "
        "thread spins about 0.1 ms, then sleeps (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT="
        "10000, unless OMP_WAIT_POLICY is set).",
        show="torch's", panel="Process"))
    processes: int = field(default=1, metadata=opt(
        "Run this many worker processes from this command, each its own consumer (worker "
        "ID suffixed -1..-N; metrics port P+0..P+N-1); one exiting, or with a fixed "
        "--metrics-port one not answering /healthz, stops the group. On a GPU, two or more "
        "share it, each with its own interpreter (docs/operations.md).",
        parse=_positive_int, panel="Process"))
