"""What a bench run does: models, transports, phase lengths, baselines, sweep and profiling.

Settings live here, apart from the code that runs them, so ``--quick``, the
full run and the CI smoke test are three values of one dataclass rather than
three code paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from batchfleet.schemas.errors import ConfigError

MODELS = ("demo-mlp", "demo-encoder")
TRANSPORTS = ("redis", "kafka")
#: Open-loop offered load, as fractions of the closed-loop saturation throughput.
LOADS = (0.25, 0.5, 0.8)
#: RQ worker classes tried for the naive baseline, fastest expected first.
RQ_CLASSES = ("rq.worker.SimpleWorker", "batchfleet.bench.rq_jobs.PreloadedForkWorker",
              "rq.worker.Worker", "rq.worker.SpawnWorker")


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """One model's worker settings and how hard the closed loop pushes it.

    The closed loop keeps ``chunk * chunks_in_flight`` requests outstanding:
    enough that a full batch is always waiting, so the worker never idles.
    """

    model: str
    max_batch_size: int
    max_wait_ms: float
    chunk: int
    chunks_in_flight: int


DEFAULT_MODEL_PLANS = {
    "demo-mlp": ModelPlan("demo-mlp", max_batch_size=256, max_wait_ms=5.0, chunk=256,
                          chunks_in_flight=8),
    "demo-encoder": ModelPlan("demo-encoder", max_batch_size=32, max_wait_ms=5.0, chunk=32,
                              chunks_in_flight=4),
}


@dataclass(frozen=True, slots=True)
class SloPlan:
    """The SLO row of the sweep: a worker run with ``--latency-slo-ms`` (it picks batch and
    wait itself), saturated, then offered each of ``loads`` (fractions of its saturation)
    with ``submit_many`` producers; fleet-side p99 is taken at each load."""

    latency_slo_ms: float = 20.0
    max_batch_size: int = 256
    max_wait_ms: float = 20.0
    loads: tuple[float, ...] = (0.1, 0.2, 0.4, 0.6, 0.8)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """The max_batch_size x max_wait_ms grid, run on one model over one transport."""

    model: str = "demo-mlp"
    transport: str = "redis"
    batch_sizes: tuple[int, ...] = (16, 64, 256)
    waits_ms: tuple[float, ...] = (1.0, 5.0, 20.0)
    #: Open-loop load, as a fraction of each point's own saturation, at which p99 is taken.
    load: float = 0.5
    #: The SLO row (``--latency-slo-ms``); None: skip it.
    slo: SloPlan | None = field(default_factory=SloPlan)
    #: "coalesced" (default) sends arrivals due together in one submit_many, so p99 shows
    #: the fleet's batching trade-off rather than the SDK's per-request submit cost
    #: (which the main latency table reports); "per-request" uses one submit each.
    submit_mode: str = "coalesced"


@dataclass(frozen=True, slots=True)
class CachePlan:
    """The cache bulk row: a bulk job of ``rows`` demo-encoder rows, half of them repeats
    at least one batch apart, with ``--cache-ttl-s`` on and off."""

    rows: int = 20_000
    cache_ttl_s: float = 3600.0
    max_batch_size: int = 32


@dataclass(frozen=True, slots=True)
class StatsCostPlan:
    """The output statistics' cost row: demo-mlp's closed-loop throughput with
    ``--no-output-stats`` and with the statistics on (the default), ``rounds`` times each,
    alternating; ``limit`` is the largest cost allowed (docs/monitoring.md)."""

    rounds: int = 2
    transport: str = "redis"
    limit: float = 0.02


@dataclass(frozen=True, slots=True)
class FloodPlan:
    """The isolation scenario: demo-mlp at ``mlp_rps`` alone, then while ``flood_rps`` bad
    demo-encoder requests a second hit the same worker; each phase ``seconds`` long."""

    transport: str = "redis"
    mlp_rps: float = 100.0
    flood_rps: float = 40.0
    seconds: float = 10.0
    max_batch_size: int = 64
    max_wait_ms: float = 5.0


@dataclass(frozen=True, slots=True)
class BenchPlan:
    models: tuple[ModelPlan, ...]
    transports: tuple[str, ...]
    out_dir: Path
    quick: bool = False
    #: Closed loop: ramp-up excluded from the window, then the measured window.
    warmup_s: float = 2.0
    closed_s: float = 10.0
    #: Open loop: length of each offered-load phase.
    open_s: float = 10.0
    loads: tuple[float, ...] = LOADS
    #: The open-loop phase with coalesced submits (one ``submit_many`` per tick, see
    #: ``open_loop``): the issue's submit_many caller-side p99 target is taken here.
    coalesced_load: float | None = 0.5
    #: A phase during which other processes used more than ``noise_cores`` cores is run
    #: again, up to ``noise_retries`` times (the machine may be shared).
    noise_retries: int = 3
    noise_cores: float = 0.15
    #: Caps requests per phase (for the CI smoke test); None: bounded by time only.
    max_requests: int | None = None
    ceiling_s: float = 3.0
    rq_classes: tuple[str, ...] = RQ_CLASSES
    #: Jobs per RQ class: SimpleWorker is fast; fork and spawn pay a process per job.
    rq_jobs: int = 3000
    rq_slow_jobs: int = 30
    #: Also run SimpleWorker as this many processes (more than the fleet's one), for context.
    rq_pool: int = 2
    sweep: SweepPlan | None = field(default_factory=SweepPlan)
    sweep_closed_s: float = 4.0
    sweep_open_s: float = 5.0
    plot_path: Path | None = Path("docs/bench-sweep.png")
    profile: bool = False
    #: Torch intra-op threads for the workers and the ceiling (OMP_NUM_THREADS for the
    #: worker processes); None: torch's default, which is what the worker ships with.
    torch_threads: int | None = None
    redis_url: str | None = None
    kafka_url: str | None = None
    seed: int = 7
    #: The failure-isolation scenario (demo-mlp under a bad demo-encoder flood); opt-in.
    flood: FloodPlan | None = None
    #: Load-generating producer processes per scenario (and for the broker-only loop).
    producers: int = 2
    #: Worker processes per fleet scenario, one consumer group (several share a GPU).
    workers: int = 1
    #: The broker-only loop (XADD / XREADGROUP / XACK+XDEL, no decode, no model) per
    #: transport, at demo-mlp's batch size and closed-loop window; off: skipped.
    broker_loop: bool = True
    #: The cache bulk row (``--cache-ttl-s`` on vs off); opt-in.
    cache: CachePlan | None = None
    #: The output statistics' cost row (on vs off); opt-in.
    stats_cost: StatsCostPlan | None = None

    def validated(self) -> BenchPlan:
        for t in self.transports:
            if t not in TRANSPORTS:
                raise ConfigError(f"unknown transport {t!r}: use redis or kafka")
        for m in self.models:
            if m.model not in MODELS:
                raise ConfigError(f"bench drives {', '.join(MODELS)}, not {m.model!r}")
            if m.max_batch_size < 1 or m.chunk < 1 or m.chunks_in_flight < 1:
                raise ConfigError(f"{m.model}: batch size and closed-loop window must be >= 1")
        if self.producers < 1:
            raise ConfigError("producers must be at least 1")
        if self.workers < 1:
            raise ConfigError("workers must be at least 1")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError("torch_threads must be at least 1")
        if not self.models or not self.transports:
            raise ConfigError("nothing to run: give at least one model and one transport")
        return self


def full_plan(out_dir: Path) -> BenchPlan:
    """The documented full run: both models, both transports, every baseline and the sweep."""
    return BenchPlan(tuple(DEFAULT_MODEL_PLANS.values()), TRANSPORTS, out_dir)


def quick_plan(out_dir: Path) -> BenchPlan:
    """Everything but the sweep, with short phases: well under two minutes on two cores."""
    return replace(
        full_plan(out_dir), quick=True, warmup_s=0.5, closed_s=2.0, open_s=2.0,
        ceiling_s=1.0, rq_classes=RQ_CLASSES[:2], rq_jobs=600, rq_slow_jobs=15, rq_pool=0,
        sweep=None, noise_retries=0)
