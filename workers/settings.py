"""Worker settings: one frozen dataclass, built once at the entry point.

Nothing below the CLI reads the environment. Each field is declared once, here, with
its default and an :func:`opt` in its metadata; from those the CLI generates the
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

**Per-model settings** (see ``workers/per_model.py``): type the field ``PerModel[T]``,
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

import functools
import os
import socket
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from typing import Any, Union, get_args, get_origin, get_type_hints

from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.connectors.values import DEFAULT_TTL_S
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import MAX_LANE_SHARDS
from batchfleet.workers.compute_limits import parse_limit
from batchfleet.workers.per_model import PerModel, parse_per_model

#: Prefix of every environment variable.
ENV_PREFIX = "BATCHFLEET_"
_META = "batchfleet"


@dataclass(frozen=True, slots=True)
class Opt:
    """How one settings field is reached from the command line and the environment."""

    help: str
    #: Defaults: ``--field-name`` and ``BATCHFLEET_FIELD_NAME`` (nested: parent's name first).
    flag: str = ""
    env: str = ""
    short: str = ""
    metavar: str = ""
    #: A ``PerModel`` field: ``--flag VALUE`` and repeatable ``--flag MODEL[@VERSION]=VALUE``.
    per_model: bool = False
    #: Repeatable flag; the variable holds the values comma-separated.
    repeat: bool = False
    #: Shown as ``***`` by --print-config (any URL's password is redacted regardless).
    secret: bool = False
    #: Used only with this broker kind; its options are grouped under it in --help.
    transport: str = ""
    #: One string -> the value; default: chosen from the field's type.
    parse: Callable[[str], Any] | None = None
    #: How --help and --print-config show a default that is computed at start-up.
    show: str = ""
    #: The --help panel the option is listed under.
    panel: str = ""


def opt(help: str, **options: Any) -> dict[str, Opt]:
    """Field metadata: ``field(default=..., metadata=opt("why it exists", ...))``."""
    return {_META: Opt(help, **options)}


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _check_retry(spec: str) -> str:
    from batchfleet.workers.retry import RetryConfig

    RetryConfig.parse(spec, RetryConfig())
    return spec


def _one_of(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value

    return parse


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


def _shard_count(value: str) -> int:
    count = int(value) if value.strip().lstrip("-").isdigit() else -1
    if not 1 <= count <= MAX_LANE_SHARDS:
        raise ValueError(f"expected a whole number from 1 to {MAX_LANE_SHARDS}")
    return count


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


def _truth(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


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
    broker: BrokerURL = field(metadata=opt(
        "redis://host:port/db or kafka://host:port[,host:port].", metavar="URL",
        parse=BrokerURL.parse, panel="Connection"))
    results_url: str = field(metadata=opt(
        "Result store, redis://host:port/db. Defaults to the broker's URL when it is Redis.",
        flag="--results", env="BATCHFLEET_RESULTS", metavar="URL", show="the broker's URL",
        panel="Connection"))
    models: tuple[str, ...] = field(default=("demo-mlp",), metadata=opt(
        "Model to serve, repeatable: demo-mlp, demo-encoder, NAME=module:factory or "
        "NAME=path.pt; NAME@VERSION=SPEC adds a version (demo-mlp@v2=demo-mlp:seed=2).",
        flag="--model", short="-m", metavar="SPEC", repeat=True,
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
    #: Whose requests share cache entries: each owner its own (API key ID, SDK ``owner=``),
    #: or everyone (a hit then tells a caller someone else sent those inputs; docs/cache.md).
    cache_scope: PerModel[str] = field(default=PerModel("owner"), metadata=opt(
        "Who shares result-cache entries: owner (each API key / SDK owner its own) or shared "
        "(everyone: reveals what others sent; docs/cache.md).", per_model=True,
        metavar="[MODEL[@VERSION]=]owner|shared", parse=_one_of("owner", "shared")))
    #: Rollout shadows (docs/rollout.md): the share of wall time each model's shadow forwards
    #: may take on their own thread (0: never; none: no limit); a batch over it is skipped.
    shadow_budget: PerModel[float | None] = field(default=PerModel(0.25), metadata=opt(
        "Share of wall time a model's shadow version may run (0 to 1; none: no limit); "
        "batches over it are not shadowed (docs/rollout.md).", per_model=True,
        metavar="[MODEL=]FRACTION", parse=_tolerance, show="0.25"))
    #: On SIGTERM, in-flight work gets this long to finish before the worker exits anyway.
    grace_s: float = field(default=30.0, metadata=opt(
        "On SIGTERM, how long in-flight work may take to finish."))
    namespace: str = field(default="bf", metadata=opt(
        "Prefix of every key, stream and topic.", panel="Connection"))
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
        parse=_one_of("eager", "compile", "onnx"), panel="Runtimes"))
    precision: PerModel[str] = field(default=PerModel("fp32"), metadata=opt(
        "fp32, bf16 (eager/compile), fp16 (CUDA) or int8 (onnx). Part of model_version.",
        per_model=True, metavar="[MODEL=]PRECISION",
        parse=_one_of("fp32", "bf16", "fp16", "int8"), panel="Runtimes"))
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
        per_model=True, metavar="[MODEL=]true|false", parse=_truth, panel="Runtimes"))

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
        if self.stuck_exit_s <= 0:
            raise ConfigError("stuck_exit_s must be positive")
        for option in setting_options(WorkerSettings):
            if option.opt.per_model:
                option.get(self).check_models(self.model_names, option.flag)
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
        "with 1 when the worker shares its cores (docs/performance.md). Idle OpenMP threads "
        "sleep (OMP_WAIT_POLICY=PASSIVE unless set).",
        show="torch's", panel="Process"))


# --- the fields, as options ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettingOption:
    """One leaf field, seen from the command line: its names, parser and default."""

    path: tuple[str, ...]
    opt: Opt
    type: Any
    default: Any
    #: The field's default factory, if it has one (then ``default`` is MISSING).
    factory: Callable[[], Any] | None = None

    @property
    def name(self) -> str:
        """The flat name: ``kafka_partitions``; also the click parameter's name."""
        return "_".join(self.path)

    @property
    def flag(self) -> str:
        return self.opt.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.opt.env or ENV_PREFIX + self.name.upper()

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.factory is None and not self.opt.show

    @property
    def repeatable(self) -> bool:
        return self.opt.repeat or self.opt.per_model

    @property
    def is_flag(self) -> bool:
        return self.type is bool

    def get(self, settings: Any) -> Any:
        for part in self.path:
            settings = getattr(settings, part)
        return settings

    def parse(self, raw: str | tuple[str, ...]) -> Any:
        """Values as the command line or the variable gave them -> the field's value.

        Raises ``ConfigError`` naming the flag."""
        try:
            if self.opt.per_model:
                return parse_per_model(raw, self._element_parser(), self.default.default,
                                       self.flag)
            if self.opt.repeat:
                parse_one = self._element_parser()
                return tuple(parse_one(v.strip()) for v in raw if v.strip())
            return self._parser(self.type)(str(raw).strip())
        except ValueError as exc:
            raise ConfigError(f"{self.flag} {raw!r}: {exc}") from exc

    def _element_parser(self) -> Callable[[str], Any]:
        return self.opt.parse or self._parser(get_args(self.type)[0])

    def _parser(self, kind: Any) -> Callable[[str], Any]:
        if self.opt.parse is not None:
            return self.opt.parse
        return type_parser(kind)

    def show_default(self, settings: Any | None = None) -> str:
        """The default as --help shows it (and the README lists it)."""
        if self.opt.show and (self.default is MISSING or self.default is None
                              or self.opt.per_model):
            return self.opt.show
        if self.default is MISSING:
            return ""
        return format_value(self.default)


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _number(kind: type[int] | type[float], raw: str) -> int | float:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"expected {'an integer' if kind is int else 'a number'}") from None


def type_parser(kind: Any) -> Callable[[str], Any]:
    """A string parser for a settings field's type (see the module docstring)."""
    if kind is bool:
        return _bool
    if kind is str:
        return str
    if kind in (int, float):
        return lambda raw: _number(kind, raw)
    args = get_args(kind)
    if get_origin(kind) in (Union, types.UnionType) and type(None) in args:
        inner = type_parser(next(a for a in args if a is not type(None)))
        return lambda raw: None if raw.lower() in ("", "none") else inner(raw)
    if get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = type_parser(args[0])
        return lambda raw: tuple(item(v.strip()) for v in raw.split(",") if v.strip())
    raise TypeError(f"no parser for settings type {kind!r}: give opt(parse=...)")


def format_value(value: Any) -> str:
    """A value as it would be written back on the command line or in the variable."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, BrokerURL):
        return value.url
    if isinstance(value, PerModel):
        return value.describe(format_value)
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


@functools.cache
def setting_options(cls: type[Any]) -> tuple[SettingOption, ...]:
    """Every leaf field of a settings dataclass, nested ones flattened, in field order."""
    return tuple(_walk(cls, (), ""))


def _walk(cls: type[Any], prefix: tuple[str, ...], transport: str) -> Iterator[SettingOption]:
    hints = get_type_hints(cls)
    for f in fields(cls):
        meta: Opt | None = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no opt(...) metadata")
        kind = hints[f.name]
        if _is_settings(kind):
            yield from _walk(kind, (*prefix, f.name), meta.transport)
            continue
        if transport and not meta.transport:
            meta = replace(meta, transport=transport)
        yield SettingOption((*prefix, f.name), meta, kind, f.default, _factory(f))


def _is_settings(kind: Any) -> bool:
    """A nested settings dataclass (every field has an opt), not a value such as BrokerURL."""
    return is_dataclass(kind) and all(_META in f.metadata for f in fields(kind))


def _factory(f: Field[Any]) -> Callable[[], Any] | None:
    return None if f.default_factory is MISSING else f.default_factory


def build(cls: type[Any], values: dict[str, Any]) -> Any:
    """A settings object from parsed flat values (``{"kafka_partitions": 8}``); fields not
    in ``values`` keep their defaults."""
    return _build(cls, (), values)


def _build(cls: type[Any], prefix: tuple[str, ...], values: dict[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        path = (*prefix, f.name)
        if _is_settings(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], path, values)
        elif "_".join(path) in values:
            kwargs[f.name] = values["_".join(path)]
    return cls(**kwargs)
