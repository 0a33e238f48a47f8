"""A whole bench run: baselines first, then every scenario, the sweep, the plot and the files.

Order matters for fairness. The model-alone ceiling runs before any server or
worker exists, so it has the CPUs to itself (and again at the end, the faster kept,
in case outside load hit one of the two); the RQ baseline runs next, alone
with its Redis; each fleet scenario then runs with only its own worker, the
client and the brokers alive. Everything is written as JSON (the record) and
markdown (the tables, regenerated from the JSON by ``report``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from batchfleet.bench.broker_loop import broker_loop
from batchfleet.bench.cache_row import run_cache_row
from batchfleet.bench.ceiling import model_ceiling
from batchfleet.bench.fleet import Services, new_namespace, services
from batchfleet.bench.flood import run_flood
from batchfleet.bench.host_speed import cpu_ticks, speed_probe_us, steal_pct, wakeup_probe_us
from batchfleet.bench.naive_rq import naive_rq
from batchfleet.bench.plan import DEFAULT_MODEL_PLANS, BenchPlan
from batchfleet.bench.profiling import py_spy, summarize
from batchfleet.bench.report import render_markdown
from batchfleet.bench.scenario import Phases, ProfilerFactory, run_scenario
from batchfleet.bench.stats_cost import run_stats_cost
from batchfleet.bench.sweep import run_slo_row, run_sweep
from batchfleet.bench.targets import evaluate
from batchfleet.bench.tracing_cost import tracing_unset_cost
from batchfleet.connectors.embedded_redis import find_redis_server
from batchfleet.schemas.json_form import finite

Progress = Callable[[str], None]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _redis_version() -> str:
    try:
        out = subprocess.run([find_redis_server(), "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
        return out.split()[2].removeprefix("v=") if out else "?"
    except Exception:  # informational only: a missing version must not stop the bench
        return "?"


def _git_commit() -> str:
    """The commit measured, with ``+dirty`` when the runtime packages have local edits."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "workers", "producers", "connectors",
             "schemas"], cwd=root, text=True, capture_output=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_meta(plan: BenchPlan, threads: int) -> dict[str, Any]:
    import rq

    cpus = os.cpu_count() or 0
    return {
        "quick": plan.quick, "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpus": cpus, "cpu_model": _cpu_model(), "torch": torch.__version__,
        "torch_threads": threads, "python": platform.python_version(),
        "redis_server": _redis_version(), "rq": rq.__version__, "commit": _git_commit(),
        "loadavg_start": [round(v, 2) for v in os.getloadavg()],
        "machine": (f"Commit {_git_commit()}; {cpus} CPUs ({_cpu_model()}), torch "
                    f"{torch.__version__} with {threads} threads, Python "
                    f"{platform.python_version()}, RQ {rq.__version__}. "
                    f"The client ({plan.producers} producer processes), Redis, Kafka (Tansu) "
                    "and the worker share these CPUs; 'other' is machine-wide busy time "
                    "outside them."),
    }


def _profiler(out_dir: Path, key: str, sink: dict[str, Any]) -> ProfilerFactory:
    @contextmanager
    def factory(worker_pid: int, client_pid: int) -> Iterator[None]:
        paths = {"worker": out_dir / "profiles" / f"{key}-worker.raw",
                 "client": out_dir / "profiles" / f"{key}-client.raw"}
        with ExitStack() as stack:
            stack.enter_context(py_spy(worker_pid, paths["worker"]))
            stack.enter_context(py_spy(client_pid, paths["client"]))
            yield
        sink[key] = {who: summarize(path) for who, path in paths.items()}

    return factory


def best_ceiling(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Per loop, the faster of two ceiling measurements; both figures are kept."""
    out = dict(first)
    for loop in ("forward", "handler"):
        a, b = first[loop], second[loop]
        best = b if b["samples_per_s"] > a["samples_per_s"] else a
        out[loop] = {**best, "measurements": [a["samples_per_s"], b["samples_per_s"]]}
    return out


def max_other_cores(report: dict[str, Any]) -> float:
    """The most CPU that anything outside the bench used during a measured window."""
    utils = []
    for s in report.get("scenarios", []):
        utils.append(s["throughput"].get("cpu_util", {}))
        utils += [p.get("cpu_util", {}) for p in s["latency"]]
    return round(max((u.get("other", 0.0) for u in utils), default=0.0), 2)


def opening_probes() -> dict[str, float | None]:
    """The host's speed on the idle machine before anything starts (``bench.host_speed``);
    :func:`closing_meta` takes the same readings at the end."""
    return {"host_speed_us_start": speed_probe_us(), "host_wakeup_us_start": _wakeup()}


def _wakeup() -> float | None:
    """The wake-up probe, or None where it cannot run (no child process, no socket pair):
    a reading that frames the run is not worth the run."""
    try:
        return wakeup_probe_us()
    except (OSError, subprocess.SubprocessError):
        return None  # the report then leaves the probe out


def closing_meta(report: dict[str, Any], ticks_start: tuple[int, int], began: float
                 ) -> dict[str, Any]:
    """What the run's end adds to its machine record: the load, the host's speed and the
    CPU stolen meanwhile (``bench.host_speed``), the most CPU outside the bench, the time."""
    return {"loadavg_end": [round(v, 2) for v in os.getloadavg()],
            "host_speed_us_end": speed_probe_us(),
            "host_wakeup_us_end": _wakeup(),
            "steal_pct": steal_pct(ticks_start, cpu_ticks()),
            "max_other_cores": max_other_cores(report),
            "elapsed_s": round(time.monotonic() - began, 1)}


def _save(plan: BenchPlan, report: dict[str, Any], complete: bool) -> None:
    """Write the JSON; also after each stage, so a late failure keeps what was measured."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    body = finite({**report, "complete": complete})
    (plan.out_dir / "bench.json").write_text(json.dumps(body, indent=2) + "\n")


def rerender(json_path: Path, plot_path: Path | None) -> dict[str, Any]:
    """Rebuild ``bench.md`` (and the plot) from a saved ``bench.json``, measuring nothing.

    Profiles are re-ranked from their raw py-spy files when those are still there,
    and targets are re-evaluated, so changing how results are presented never needs
    a new run.
    """
    report: dict[str, Any] = json.loads(json_path.read_text())
    for key, prof in report.get("profiles", {}).items():
        for who, summary in list(prof.items()):
            raw = Path(summary.get("raw", ""))
            if raw.is_file():
                prof[who] = summarize(raw)
        report["profiles"][key] = prof
    report["targets"] = [t.as_dict() for t in evaluate(report)]
    if report.get("sweep") and plot_path is not None:
        from batchfleet.bench.plot import plot_sweep

        report["plot"] = str(plot_sweep(report["sweep"], plot_path, _plot_title(report)))
    report = finite(report)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    json_path.with_name("bench.md").write_text(render_markdown(report))
    return report


def _plot_title(report: dict[str, Any]) -> str:
    sweep = report["plan"]["sweep"]
    threads = report["meta"]["torch_threads"]
    return (f"{sweep['model']} over {sweep['transport']}: saturation throughput vs p99 at "
            f"{sweep['load']:.0%} load\n({report['meta']['cpus']} CPUs shared by all "
            f"processes, {threads} torch thread{'s' if threads != 1 else ''})")


def _baselines(plan: BenchPlan, svc: Services, report: dict[str, Any],
               worker_env: tuple[tuple[str, str], ...], say: Progress) -> None:
    """Naive RQ, then the broker-only loop: each alone with its servers."""
    if plan.rq_classes:
        say(f"naive RQ on the same Redis: {', '.join(plan.rq_classes)}")
        report["naive_rq"] = naive_rq(svc.redis_url, plan.rq_classes, plan.rq_jobs,
                                      plan.rq_slow_jobs, plan.rq_pool, dict(worker_env))
        _save(plan, report, complete=False)
    if plan.broker_loop:
        report["broker_loop"] = _broker_loops(plan, svc, say)
        _save(plan, report, complete=False)


def _broker_loops(plan: BenchPlan, svc: Services, say: Progress) -> dict[str, Any]:
    """Baseline (c) per transport, at demo-mlp's batch size and closed-loop window."""
    mlp = next((m for m in plan.models if m.model == "demo-mlp"), DEFAULT_MODEL_PLANS["demo-mlp"])
    out = {}
    for transport in plan.transports:
        say(f"broker-only loop over {transport}: batch {mlp.max_batch_size}, "
            f"{plan.producers} producer processes")
        out[transport] = broker_loop(
            transport, svc.broker_for(transport), svc.server_pids(),
            batch=mlp.max_batch_size, window=mlp.chunk * mlp.chunks_in_flight,
            producers=plan.producers, warmup_s=plan.warmup_s, duration_s=plan.closed_s,
            namespace=new_namespace(f"loop-{transport}"))
    return out


def _sweep_stage(plan: BenchPlan, svc: Services, report: dict[str, Any], threads: int,
                 say: Progress) -> None:
    """The batch x wait grid, then its SLO row; both into ``report``."""
    sweep = plan.sweep
    assert sweep is not None
    say(f"sweep: {sweep.model} over {sweep.transport}, batch {sweep.batch_sizes} x "
        f"wait {sweep.waits_ms} ms")
    ceiling = report["ceilings"].get(sweep.model) or model_ceiling(
        sweep.model, 64, plan.ceiling_s, threads)
    cpu_per_wall = ceiling["handler"]["cpu_per_wall"]
    phases = Phases(plan.warmup_s, plan.sweep_closed_s, plan.sweep_open_s, (sweep.load,),
                    plan.max_requests, None, plan.noise_retries, plan.noise_cores,
                    plan.producers)
    report["sweep"] = run_sweep(svc, sweep, phases, model_cpu_per_wall=cpu_per_wall,
                                seed=plan.seed)
    if sweep.slo is not None:
        say(f"sweep SLO row: --latency-slo-ms {sweep.slo.latency_slo_ms:g}, open loop at "
            f"{', '.join(f'{x:.0%}' for x in sweep.slo.loads)} of saturation")
        report["sweep_slo"] = run_slo_row(svc, sweep, phases, report["sweep"],
                                          model_cpu_per_wall=cpu_per_wall, seed=plan.seed)
        if "skipped" in report["sweep_slo"]:
            say(f"sweep SLO row skipped: {report['sweep_slo']['skipped']}")


def _cache_stage(plan: BenchPlan, svc: Services, report: dict[str, Any],
                 say: Progress) -> None:
    assert plan.cache is not None
    say(f"cache bulk row: {plan.cache.rows:,} demo-encoder rows, half repeats, "
        "--cache-ttl-s on vs off")
    report["cache_bulk"] = run_cache_row(svc, plan.cache, plan.seed)
    if "skipped" in report["cache_bulk"]:
        say(f"cache bulk row skipped: {report['cache_bulk']['skipped']}")


def _stats_cost_stage(plan: BenchPlan, svc: Services, report: dict[str, Any],
                      phases: Phases, threads: int, say: Progress) -> None:
    cost = plan.stats_cost
    assert cost is not None
    say(f"output statistics cost: demo-mlp over {cost.transport}, --no-output-stats vs "
        f"on, {cost.rounds} rounds")
    ceiling = report["ceilings"].get("demo-mlp") or model_ceiling(
        "demo-mlp", DEFAULT_MODEL_PLANS["demo-mlp"].max_batch_size, plan.ceiling_s, threads)
    report["stats_cost"] = run_stats_cost(svc, cost, phases, seed=plan.seed,
                                          model_cpu_per_wall=ceiling["handler"]["cpu_per_wall"])
    if "cost" in report["stats_cost"]:
        say(f"output statistics cost: {report['stats_cost']['cost']:.2%}")


def _scenario_stage(plan: BenchPlan, svc: Services, report: dict[str, Any], phases: Phases,
                    profiles: dict[str, Any], say: Progress) -> None:
    """Every model over every transport, each with the host's speed read just before it;
    the report is saved after each, so a run stopped midway keeps what it measured."""
    report["scenarios"] = []
    for transport in plan.transports:
        for m in plan.models:
            say(f"{m.model} over {transport}: batch {m.max_batch_size}, "
                f"wait {m.max_wait_ms:g} ms, {plan.workers} worker process(es)")
            key = f"{m.model}-{transport}"
            # the host's speed moves within a run: read it before each scenario too, on the
            # machine idle between them, so a phase that ran slow is told from a slow change
            speed = speed_probe_us()
            report["scenarios"].append({**run_scenario(
                svc, transport, m, phases, seed=plan.seed,
                model_cpu_per_wall=report["ceilings"][m.model]["handler"]["cpu_per_wall"],
                profiler=_profiler(plan.out_dir, key, profiles) if plan.profile else None,
                workers=plan.workers), "host_speed_us_before": speed})
            _save(plan, {**report, "profiles": profiles}, complete=False)


def run_bench(plan: BenchPlan, progress: Progress = lambda _: None) -> dict[str, Any]:
    """Run ``plan``; returns the report and writes ``bench.json`` and ``bench.md``."""
    plan = plan.validated()
    began = time.monotonic()

    def say(message: str) -> None:
        progress(f"[{time.monotonic() - began:6.1f}s] {message}")

    # Worker subprocesses inherit this environment, so torch's default here is theirs too;
    # --torch-threads sets both (OMP_NUM_THREADS for the workers).
    threads = plan.torch_threads or torch.get_num_threads()
    worker_env = (("OMP_NUM_THREADS", str(threads)),) if plan.torch_threads else ()
    ticks_start = cpu_ticks()
    report: dict[str, Any] = {"meta": machine_meta(plan, threads),
                              "plan": finite(json.loads(json.dumps(asdict(plan), default=str)))}
    report["meta"].update(opening_probes())
    report["ceilings"] = {}
    for m in plan.models:
        say(f"model alone: {m.model} at batch {m.max_batch_size}, {threads} torch threads")
        report["ceilings"][m.model] = model_ceiling(m.model, m.max_batch_size, plan.ceiling_s,
                                                    threads)
    phases = Phases(plan.warmup_s, plan.closed_s, plan.open_s, plan.loads, plan.max_requests,
                    plan.coalesced_load, plan.noise_retries, plan.noise_cores, plan.producers)
    profiles: dict[str, Any] = {}
    need_kafka = "kafka" in plan.transports or (
        plan.flood is not None and plan.flood.transport == "kafka")
    with services(plan.redis_url, plan.kafka_url, need_kafka, worker_env) as svc:
        _baselines(plan, svc, report, worker_env, say)
        _scenario_stage(plan, svc, report, phases, profiles, say)
        if plan.flood is not None:
            flood = plan.flood
            say(f"isolation: demo-mlp at {flood.mlp_rps:g}/s over {flood.transport}, alone "
                f"then with {flood.flood_rps:g}/s bad demo-encoder requests")
            report["flood"] = run_flood(svc, flood, plan.seed)
            _save(plan, {**report, "profiles": profiles}, complete=False)
        if plan.sweep is not None:
            _sweep_stage(plan, svc, report, threads, say)
            _save(plan, {**report, "profiles": profiles}, complete=False)
        if plan.cache is not None:
            _cache_stage(plan, svc, report, say)
        if plan.stats_cost is not None:
            _stats_cost_stage(plan, svc, report, phases, threads, say)
            _save(plan, {**report, "profiles": profiles}, complete=False)
    for m in plan.models:
        # Measured again now that every server and worker is gone, and the faster of the
        # two kept per loop: a ceiling is an upper bound, and outside load during one of
        # the two measurements can only have lowered it.
        say(f"model alone again: {m.model}")
        report["ceilings"][m.model] = best_ceiling(
            report["ceilings"][m.model],
            model_ceiling(m.model, m.max_batch_size, plan.ceiling_s, threads))
    if profiles:
        report["profiles"] = profiles
    if plan.sweep is not None and plan.plot_path is not None and report.get("sweep"):
        from batchfleet.bench.plot import plot_sweep

        report["plot"] = str(plot_sweep(report["sweep"], plan.plot_path, _plot_title(report)))
    report["tracing_unset"] = tracing_unset_cost()
    report["meta"].update(closing_meta(report, ticks_start, began))
    report["targets"] = [t.as_dict() for t in evaluate(report)]
    report = finite({**report, "complete": True})
    _save(plan, report, complete=True)
    (plan.out_dir / "bench.md").write_text(render_markdown(report))
    say(f"wrote {plan.out_dir / 'bench.json'} and {plan.out_dir / 'bench.md'}")
    return report
