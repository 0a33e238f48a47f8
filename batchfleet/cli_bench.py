"""``batchfleet bench``: throughput, latency, baselines, sweep and profile in one run."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from batchfleet.options import JsonOpt, fail

if TYPE_CHECKING:
    from batchfleet.bench.plan import BenchPlan, ModelPlan


def bench(
    quick: Annotated[bool, typer.Option(
        "--quick", help="Short phases and no sweep: the whole run in under two minutes.")
    ] = False,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="demo-mlp and/or demo-encoder (repeatable). Default: both.")
    ] = None,
    transport: Annotated[list[str] | None, typer.Option(
        "--transport", "-t", help="redis and/or kafka (repeatable). Default: both.")] = None,
    out: Annotated[Path, typer.Option(
        help="Directory for bench.json, bench.md and py-spy profiles.")
    ] = Path("bench-results"),
    sweep: Annotated[bool | None, typer.Option(
        "--sweep/--no-sweep",
        help="Run the max_batch_size x max_wait_ms sweep. Default: on, off with --quick.")
    ] = None,
    sweep_batch: Annotated[list[int] | None, typer.Option(
        help="Sweep max_batch_size values (repeatable). Default: 16, 64, 256.")] = None,
    sweep_wait: Annotated[list[float] | None, typer.Option(
        help="Sweep max_wait_ms values (repeatable). Default: 1, 5, 20.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Where the sweep's throughput-vs-p99 PNG goes. Default: OUT/bench-sweep.png.")
    ] = None,
    flood: Annotated[bool, typer.Option(
        "--flood", help="Add the isolation scenario: demo-mlp p99 alone and while 40 bad "
                        "demo-encoder requests/s hit the same worker.")] = False,
    flood_rps: Annotated[float | None, typer.Option(
        help="Bad demo-encoder requests per second in the --flood scenario (default 40).")
    ] = None,
    producers: Annotated[int | None, typer.Option(
        "--producers", help="Separate load-generating producer processes per scenario (and "
                            "for the broker-only loop). Default: 2.")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="Worker processes per fleet scenario, one consumer group (on a "
                          "GPU, several share it, each with its own interpreter). Their "
                          "CPU is summed; the ratios stay against one model-alone "
                          "ceiling. Default: 1.")] = None,
    broker_loop: Annotated[bool, typer.Option(
        "--broker-loop/--no-broker-loop",
        help="Run the broker-only loop baseline (XADD / XREADGROUP / XACK+XDEL on "
             "request-sized payloads, no decode, no model; aiokafka on Kafka).")] = True,
    slo: Annotated[bool, typer.Option(
        "--slo/--no-slo", help="Add the sweep's SLO row (worker with --latency-slo-ms 20, "
                               "open loop at 10-80% of saturation); needs --sweep.")] = True,
    cache: Annotated[bool, typer.Option(
        "--cache", help="Add the cache bulk row: 20,000 demo-encoder rows, half repeats, "
                        "--cache-ttl-s on vs off (skipped when the worker lacks it).")
    ] = False,
    cache_rows: Annotated[int | None, typer.Option(
        help="Rows in the --cache bulk job (default 20,000).")] = None,
    stats_cost: Annotated[bool, typer.Option(
        "--stats-cost", help="Add the output statistics' cost row: demo-mlp closed loop "
                             "with --no-output-stats and with them on, alternating, two "
                             "rounds each (docs/monitoring.md).")] = False,
    profile: Annotated[bool, typer.Option(
        "--profile", help="Extra passes under py-spy (worker and client); ranked hot spots.")
    ] = False,
    seconds: Annotated[float | None, typer.Option(
        help="Length of each measured phase (closed loop, each open-loop load).")] = None,
    max_requests: Annotated[int | None, typer.Option(
        help="Cap requests per phase (smoke tests); with --capacity, the requests "
             "counted (default 20,000).")] = None,
    max_wait_ms: Annotated[float | None, typer.Option(
        help="Worker max_wait_ms for both models (default 5).")] = None,
    mlp_batch_size: Annotated[int | None, typer.Option(
        help="demo-mlp max_batch_size (default 256).")] = None,
    encoder_batch_size: Annotated[int | None, typer.Option(
        help="demo-encoder max_batch_size (default 32).")] = None,
    rq_jobs: Annotated[int | None, typer.Option(
        help="Jobs for the naive RQ SimpleWorker baseline.")] = None,
    torch_threads: Annotated[int | None, typer.Option(
        help="Torch intra-op threads for workers and the ceiling (default: torch's own, "
             "as the worker ships).")] = None,
    rq: Annotated[bool, typer.Option("--rq/--no-rq", help="Run the naive RQ baseline.")
                  ] = True,
    rq_class: Annotated[list[str] | None, typer.Option(
        help="RQ worker classes to compare (repeatable, dotted paths). Default: SimpleWorker "
             "and a fork worker with the model preloaded; the full run adds Worker and "
             "SpawnWorker.")] = None,
    redis: Annotated[str | None, typer.Option(
        "--redis", help="Use this Redis (broker, results, RQ) instead of an embedded one.")
    ] = None,
    kafka: Annotated[str | None, typer.Option(
        "--kafka", help="Use this Kafka (kafka://host:port) instead of the bundled Tansu.")
    ] = None,
    from_json: Annotated[Path | None, typer.Option(
        help="Measure nothing: re-render bench.md (and the plot) from this bench.json.")
    ] = None,
    runtimes: Annotated[bool, typer.Option(
        "--runtimes", help="Instead of the fleet bench: every available runtime x precision "
                           "(eager, compile, onnx; fp32, bf16, int8) for the models, model "
                           "alone and end to end, speedup over eager fp32 and accuracy; "
                           "writes runtimes.json/.md/.png under --out (docs/runtimes.md).")
    ] = False,
    capacity: Annotated[bool, typer.Option(
        "--capacity", help="Instead of the fleet bench: count what each request costs Redis "
                           "(INFO commandstats calls per command, net bytes in and out, "
                           "memory per queued request and per result) for --max-requests "
                           "demo-mlp requests (default 20,000) submitted with submit_many, "
                           "next to the capacity model's prediction; writes capacity.json "
                           "under --out (docs/scaling.md). With --redis "
                           "redis+cluster://host:port,... or --cluster, on a Redis Cluster: "
                           "every primary read and summed, and each primary's share.")
    ] = False,
    degrade: Annotated[bool, typer.Option(
        "--degrade", help="Instead of the fleet bench: a model failing every request while "
                          "open-loop traffic continues (--rps, default 50/s, for --seconds), "
                          "without and with a fallback chain; caller p99 and the share "
                          "answered (docs/degradation.md, docs/performance.md).")] = False,
    on_demand: Annotated[bool, typer.Option(
        "--on-demand", help="Instead of the fleet bench: six demo-encoder models on a "
                            "worker that holds two (--max-loaded-models 2), open-loop "
                            "traffic (--rps, default 40/s, for --seconds) on a hot pair "
                            "moving every 2 s; cold first-request p50/p99, loads and "
                            "evictions per minute, throughput beside a worker holding all "
                            "(docs/models.md, docs/performance.md).")] = False,
    rps: Annotated[float | None, typer.Option(
        help="With --degrade or --on-demand: the offered requests per second (default 50 "
             "and 40).")] = None,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="With --capacity and no --redis: start a throwaway Redis Cluster "
                          "(3 primaries, 3 replicas on loopback) and count on it.")] = False,
    poll_interval_s: Annotated[float | None, typer.Option(
        help="With --capacity: the clients' safety poll in seconds (default 1, the SDK's). "
             "Every 10th poll re-reads every outstanding wait, and a run that spans one "
             "counts those reads on top of the request paths.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark the fleet end to end against the model alone, naive RQ and the
    broker-only loop, in one run.

    Starts its own Redis (and Kafka-compatible broker), real worker processes,
    producer processes that generate the load, and RQ workers on free loopback
    ports; writes bench.json and bench.md to --out and prints the tables.
    docs/performance.md explains the method.

    Examples:

        batchfleet bench --quick

        batchfleet bench --profile

        batchfleet bench --quick -m demo-mlp -t redis --no-rq

        batchfleet bench --quick --flood

        batchfleet bench --quick --producers 3 --no-broker-loop

        batchfleet bench --sweep --cache

        batchfleet bench --quick --no-sweep --stats-cost

        batchfleet bench --no-sweep --seconds 20 --out /tmp/bench

        batchfleet bench --quick --torch-threads 1 --out bench-results/one-thread

        batchfleet bench --from-json bench-results/bench.json --plot docs/bench-sweep.png

        batchfleet bench --runtimes -m demo-encoder --out bench-results/runtimes

        batchfleet bench --degrade --rps 50 --seconds 10

        batchfleet bench --on-demand --rps 40 --seconds 40

        batchfleet bench --capacity --max-requests 20000

        batchfleet bench --capacity --cluster --max-requests 20000 --poll-interval-s 5
    """
    _require_bench()
    from batchfleet.bench.plan import FloodPlan, full_plan, quick_plan
    from batchfleet.bench.report import render_markdown
    from batchfleet.bench.run import rerender, run_bench
    from batchfleet.schemas.errors import BatchfleetError

    _check_url(redis)
    if capacity or cluster:  # a measurement of its own instead of the fleet bench
        return _bench_capacity(out, max_requests, mlp_batch_size, max_wait_ms, redis,
                               cluster, poll_interval_s, as_json, capacity)
    if degrade:  # likewise
        return _bench_degrade(redis, rps or 50.0, seconds or (5.0 if quick else 10.0),
                              as_json)
    if on_demand:  # likewise
        return _bench_on_demand(redis, rps or 40.0, seconds or (20.0 if quick else 40.0),
                                as_json)
    if runtimes:  # likewise
        return _bench_runtimes(model, out, seconds or (4.0 if quick else 8.0), redis,
                               max_requests, as_json)
    if from_json is not None:
        if not from_json.is_file():
            raise fail(f"--from-json {from_json}: no such file")
        report = rerender(from_json, plot or out / "bench-sweep.png")
        typer.echo(json.dumps(report, indent=2) if as_json else render_markdown(report))
        return

    plan = quick_plan(out) if quick else full_plan(out)
    models = _model_plans(model, mlp_batch_size, encoder_batch_size, max_wait_ms)
    plan = replace(plan, models=models, transports=tuple(transport or plan.transports),
                   plot_path=plot or out / "bench-sweep.png", profile=profile,
                   max_requests=max_requests, torch_threads=torch_threads,
                   redis_url=redis, kafka_url=kafka, workers=workers or 1)
    if flood or flood_rps is not None:
        flood_plan = FloodPlan(transport=(transport or ["redis"])[0])
        if seconds is not None or quick:
            flood_plan = replace(flood_plan, seconds=seconds if seconds is not None else 5.0)
        if flood_rps is not None:
            flood_plan = replace(flood_plan, flood_rps=flood_rps)
        plan = replace(plan, flood=flood_plan)
    if sweep is not None:
        plan = replace(plan, sweep=full_plan(out).sweep if sweep else None)
    plan = _load_and_rows(plan, producers, broker_loop, slo, cache, cache_rows, seconds)
    if stats_cost:
        from batchfleet.bench.plan import StatsCostPlan

        plan = replace(plan, stats_cost=StatsCostPlan(transport=(transport or ["redis"])[0]))
    if plan.sweep is not None and (sweep_batch or sweep_wait):
        plan = replace(plan, sweep=replace(
            plan.sweep, batch_sizes=tuple(sweep_batch or plan.sweep.batch_sizes),
            waits_ms=tuple(sweep_wait or plan.sweep.waits_ms)))
    if not rq or "demo-mlp" not in {m.model for m in plan.models}:
        plan = replace(plan, rq_classes=())
    else:
        if rq_jobs is not None:
            plan = replace(plan, rq_jobs=rq_jobs, rq_slow_jobs=min(plan.rq_slow_jobs, rq_jobs))
        if rq_class:
            plan = replace(plan, rq_classes=tuple(rq_class))
    try:
        report = run_bench(plan, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    typer.echo(json.dumps(report, indent=2) if as_json else render_markdown(report))


def _model_plans(model: list[str] | None, mlp_batch_size: int | None,
                 encoder_batch_size: int | None, max_wait_ms: float | None
                 ) -> tuple[ModelPlan, ...]:
    """The models to drive, with --mlp-batch-size, --encoder-batch-size and --max-wait-ms."""
    from batchfleet.bench.plan import DEFAULT_MODEL_PLANS

    models = []
    for name in model or list(DEFAULT_MODEL_PLANS):
        if name not in DEFAULT_MODEL_PLANS:
            raise fail(f"--model {name!r}: bench drives {', '.join(DEFAULT_MODEL_PLANS)}")
        m = DEFAULT_MODEL_PLANS[name]
        size = {"demo-mlp": mlp_batch_size, "demo-encoder": encoder_batch_size}[name]
        if size is not None:
            chunk = max(size, 32)
            m = replace(m, max_batch_size=size, chunk=chunk,
                        chunks_in_flight=max(4, min(32, m.chunk * m.chunks_in_flight // chunk)))
        if max_wait_ms is not None:
            m = replace(m, max_wait_ms=max_wait_ms)
        models.append(m)
    return tuple(models)


#: What `batchfleet bench` says where the bench's own distribution is not installed.
BENCH_MISSING = ("'batchfleet bench' needs the batchfleet-bench package: pip install "
                 "batchfleet-bench (from a clone: pip install ./bench)")


def _require_bench() -> None:
    """One line and exit 2 where ``batchfleet.bench`` is absent: it ships outside the
    batchfleet wheel (bench/pyproject.toml), as a missing extra would be reported."""
    try:
        import batchfleet.bench  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "batchfleet.bench":
            raise
        raise fail(BENCH_MISSING) from None


def _load_and_rows(plan: BenchPlan, producers: int | None, broker_loop: bool, slo: bool,
                   cache: bool, cache_rows: int | None, seconds: float | None) -> BenchPlan:
    """Apply --producers, --no-broker-loop, --no-slo, --cache/--cache-rows and --seconds."""
    from batchfleet.bench.plan import CachePlan

    if seconds is not None:
        plan = replace(plan, closed_s=seconds, open_s=seconds, sweep_closed_s=seconds,
                       sweep_open_s=seconds, ceiling_s=min(plan.ceiling_s, seconds))
    if plan.sweep is not None and not slo:
        plan = replace(plan, sweep=replace(plan.sweep, slo=None))
    if producers is not None:
        plan = replace(plan, producers=producers)
    if not broker_loop:
        plan = replace(plan, broker_loop=False)
    if cache or cache_rows is not None:
        plan = replace(plan, cache=CachePlan(rows=cache_rows or CachePlan().rows))
    return plan


def _check_url(redis: str | None) -> None:
    """``--redis`` as strictly as every URL: a malformed one never means a default host."""
    from batchfleet.connectors.urls import parse_url, result_store_schemes
    from batchfleet.schemas.errors import ConfigError

    if redis is not None:
        try:
            parse_url(redis, result_store_schemes(), "--redis")
        except ConfigError as exc:
            raise fail(str(exc)) from exc


def _bench_degrade(redis: str | None, rps: float, seconds: float, as_json: bool) -> None:
    """``bench --degrade``: batchfleet/bench/degrade.py."""
    from batchfleet.bench.degrade import render, run_degrade
    from batchfleet.schemas.json_form import finite

    found = run_degrade(redis, rps=rps, seconds=seconds)
    typer.echo(json.dumps(finite(found), indent=2) if as_json else render(found))


def _bench_on_demand(redis: str | None, rps: float, seconds: float, as_json: bool) -> None:
    """``bench --on-demand``: batchfleet/bench/on_demand.py."""
    from batchfleet.bench.on_demand import render, run_on_demand
    from batchfleet.schemas.json_form import finite

    found = run_on_demand(redis, rps=rps, seconds=seconds)
    typer.echo(json.dumps(finite(found), indent=2) if as_json else render(found))


def _bench_runtimes(models: list[str] | None, out: Path, seconds: float, redis: str | None,
                    max_requests: int | None, as_json: bool) -> None:
    """``bench --runtimes``: batchfleet/bench/runtimes.py."""
    from batchfleet.bench.runtimes import bench_runtimes, render
    from batchfleet.schemas.errors import BatchfleetError

    try:
        found = bench_runtimes(models or ["demo-encoder", "demo-mlp"], out, seconds=seconds,
                               redis_url=redis, max_requests=max_requests)
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    typer.echo(json.dumps(found, indent=2) if as_json else render(found))


def _bench_capacity(out: Path, requests: int | None, batch_size: int | None,
                    max_wait_ms: float | None, redis: str | None, cluster: bool,
                    poll_interval_s: float | None, as_json: bool, capacity: bool) -> None:
    """``bench --capacity``: batchfleet/bench/capacity_run.py."""
    from batchfleet.bench.capacity import CapacityPlan
    from batchfleet.bench.capacity_run import render, run_capacity
    from batchfleet.schemas.errors import BatchfleetError

    if not capacity:
        raise fail("--cluster goes with --capacity")
    if cluster and redis is not None:
        raise fail("--cluster starts its own cluster: leave out --redis, or pass "
                   "--redis redis+cluster://host:port,... for an existing one")
    plan = CapacityPlan(redis_url=redis, cluster=cluster)
    if requests is not None:
        if requests < 1:
            raise fail("--max-requests must be at least 1")
        plan = replace(plan, requests=requests)
    if batch_size is not None:
        plan = replace(plan, max_batch_size=batch_size)
    if max_wait_ms is not None:
        plan = replace(plan, max_wait_ms=max_wait_ms)
    if poll_interval_s is not None:
        if poll_interval_s <= 0:
            raise fail("--poll-interval-s must be positive")
        plan = replace(plan, poll_interval_s=poll_interval_s)
    try:
        found = run_capacity(plan)
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(json.dumps(found, indent=2))
    typer.echo(json.dumps(found, indent=2) if as_json else render(found))
