"""``bench --runtimes``: every available runtime x precision, against eager fp32, in one run.

For each model and each combination this machine can run it measures, side by side:

* the **model alone**: the handler's ``predict`` on one batch in a tight loop, after the
  runtime's own start-up; rounds interleave the combinations and each keeps its best;
* **end to end**: a real ``batchfleet worker`` subprocess started with ``--runtime`` and
  ``--precision``, saturated by a closed loop over Redis;
* the **accuracy** the start-up gate measured (max-abs and mean-abs difference from eager
  fp32 on 256 seeded rows) and the start-up time (build, bucket warm-up, gate).

Speedups are ratios to eager fp32 in the same run, so a busy machine moves every row
alike. ``runtimes.png`` (under ``--out``) draws them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from batchfleet.bench.ceiling import best_of, waiter
from batchfleet.bench.closed_loop import closed_loop
from batchfleet.bench.fleet import new_namespace, services
from batchfleet.bench.procstat import CpuMeter
from batchfleet.demo import demo_inputs
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.models import load_model
from batchfleet.workers.models.onnx_runtime import onnx_available
from batchfleet.workers.models.runtimes import RuntimeChoice, RuntimeHandler, check_combination

#: Every combination worth measuring; those the device refuses are listed as skipped.
COMBINATIONS: tuple[tuple[str, str], ...] = (
    ("eager", "fp32"), ("eager", "bf16"), ("eager", "fp16"), ("compile", "fp32"),
    ("onnx", "fp32"), ("onnx", "int8"))
DEFAULT_BATCH = {"demo-encoder": 32, "demo-mlp": 256}


def available(model: str, device: torch.device,
              wanted: Sequence[tuple[str, str]] = COMBINATIONS
              ) -> tuple[list[RuntimeChoice], dict[str, str]]:
    """The combinations ``device`` runs, and why each other one is refused (one line)."""
    runnable: list[RuntimeChoice] = []
    refused: dict[str, str] = {}
    for runtime, precision in wanted:
        choice = RuntimeChoice(runtime, precision)
        try:
            if not choice.is_default:
                check_combination(model, choice, device)
        except ConfigError as exc:
            refused[choice.label] = str(exc)
            continue
        runnable.append(choice)
    return runnable, refused


def model_alone(model: str, choices: Sequence[RuntimeChoice], batch_size: int,
                seconds: float, rounds: int = 4,
                device: torch.device | None = None
                ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Start-up, gate and the forward-only ceiling of each combination, in this process.

    Every handler is built first; then the timed rounds go round-robin over them, and
    each keeps its best round. On a shared machine a burst of someone else's load then
    lands on every combination alike instead of on whichever ran at that moment.
    """
    device = device or torch.device("cpu")
    wait = waiter(device)
    built: dict[str, tuple[Any, Any, float]] = {}
    gated: dict[str, str] = {}
    for choice in choices:
        start = time.perf_counter()
        try:
            handler = load_model(model, batch_size, choice)
            handler.setup(device)  # the accuracy gate runs here, on the device
        except ConfigError as exc:  # refused: listed with its reason, not fatal
            gated[choice.label] = str(exc)
            continue
        startup_s = time.perf_counter() - start
        built[choice.label] = (handler, handler.preprocess(list(demo_inputs(model, batch_size))),
                               startup_s)
    best: dict[str, list[float]] = {label: [] for label in built}
    for _ in range(rounds):
        for label, (handler, batch, _) in built.items():
            timing, _ = best_of(partial(_predicted, handler, batch, wait), batch_size,
                                seconds / rounds, 1)
            best[label].append(timing.samples_per_s)
    found: dict[str, dict[str, Any]] = {}
    for label, (handler, _, startup_s) in built.items():
        info = handler.info() if isinstance(handler, RuntimeHandler) else {}
        found[label] = {"samples_per_s": round(max(best[label]), 1),
                        "rounds": [round(r, 1) for r in best[label]],
                        "startup_s": round(startup_s, 2),
                        "startup_parts_s": info.get("startup_s", {}),
                        "accuracy": info.get("accuracy"), "version": handler.version}
    return found, gated


def _predicted(handler: Any, batch: Any, wait: Any) -> object:
    return wait(handler.predict(batch))


async def _end_to_end(svc_redis: str, model: str, choice: RuntimeChoice, batch_size: int,
                      seconds: float, max_requests: int | None) -> dict[str, Any]:
    namespace = new_namespace(f"rt-{choice.label}")
    args = ("--max-batch-size", str(batch_size), "--max-wait-ms", "5",
            "--runtime", choice.runtime, "--precision", choice.precision)
    proc = WorkerProcess(svc_redis, svc_redis, models=(model,), namespace=namespace,
                         log_level="warning", extra_args=args, keep_log=False,
                         device="auto")
    with proc:
        start = time.perf_counter()
        await asyncio.to_thread(proc.wait_ready, 600.0)
        ready_s = time.perf_counter() - start
        assert proc.proc is not None
        meter = CpuMeter({"worker": proc.proc.pid})
        async with AsyncClient(svc_redis, svc_redis, namespace=namespace) as client:
            run = await closed_loop(
                client, model, demo_inputs(model, 4096), chunk=batch_size, lanes=4,
                warmup_s=min(3.0, seconds / 3), duration_s=seconds, meter=meter,
                max_requests=max_requests)
    return {"throughput_rps": round(run.throughput_rps, 1), "completed": len(run.samples),
            "ready_s": round(ready_s, 1)}


def bench_runtimes(models: Sequence[str], out: Path, *, seconds: float = 8.0,
                   redis_url: str | None = None, max_requests: int | None = None,
                   batch_sizes: dict[str, int] | None = None,
                   wanted: Sequence[tuple[str, str]] = COMBINATIONS) -> dict[str, Any]:
    """Measure every available combination of every model; write runtimes.json/.md/.png."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "onnx": onnx_available(),
                              "models": {}}
    with services(redis_url, None, need_kafka=False) as svc:
        for model in models:
            batch = (batch_sizes or {}).get(model, DEFAULT_BATCH.get(model, 32))
            runnable, refused = available(model, device, wanted)
            alone, gated = model_alone(model, runnable, batch, seconds, device=device)
            refused.update(gated)  # the accuracy gate refused them: listed, not fatal
            rows: dict[str, Any] = {}
            for choice in (c for c in runnable if c.label in alone):
                e2e = asyncio.run(_end_to_end(svc.redis_url, model, choice, batch, seconds,
                                              max_requests))
                rows[choice.label] = {"model_alone": alone[choice.label], "end_to_end": e2e}
            _add_speedups(rows)
            report["models"][model] = {"batch_size": batch, "results": rows,
                                       "refused": refused}
    out.mkdir(parents=True, exist_ok=True)
    import json

    (out / "runtimes.json").write_text(json.dumps(report, indent=2))
    (out / "runtimes.md").write_text(render(report))
    plot_runtimes(report, out / "runtimes.png")
    return report


def _add_speedups(rows: dict[str, Any]) -> None:
    base = rows.get("eager-fp32")
    if base is None:
        return
    for row in rows.values():
        for part, key in (("model_alone", "samples_per_s"), ("end_to_end", "throughput_rps")):
            ref = base[part][key]
            row[part]["speedup"] = round(row[part][key] / ref, 2) if ref else None


def render(report: dict[str, Any]) -> str:
    """The markdown table docs/runtimes.md quotes."""
    lines = [f"device {report['device']}, torch {report['torch']}, "
             f"{report['threads']} threads", ""]
    for model, entry in report["models"].items():
        lines += [f"### {model} (max_batch_size {entry['batch_size']})", "",
                  "| runtime | model alone (samples/s) | speedup | end to end (req/s) | speedup "
                  "| max-abs diff | mean-abs diff | start-up s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for label, row in entry["results"].items():
            alone, e2e, acc = row["model_alone"], row["end_to_end"], row["model_alone"]["accuracy"]
            lines.append(
                f"| {label} | {alone['samples_per_s']} | {alone.get('speedup', '')}x "
                f"| {e2e['throughput_rps']} | {e2e.get('speedup', '')}x "
                f"| {_g(acc, 'max_abs')} | {_g(acc, 'mean_abs')} | {alone['startup_s']} |")
        for label, why in entry["refused"].items():
            lines.append(f"| {label} | refused: {why} | | | | | | |")
        lines.append("")
    return "\n".join(lines)


def _g(acc: dict[str, Any] | None, key: str) -> str:
    return "0 (reference)" if acc is None else f"{acc[key]:.2g}"


def plot_runtimes(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars: speedup over eager fp32, model alone and end to end, per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["models"])
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(6 * max(1, len(models)), 4),
                             squeeze=False)
    for ax, model in zip(axes[0], models, strict=False):
        rows = report["models"][model]["results"]
        labels = list(rows)
        xs = range(len(labels))
        alone = [rows[k]["model_alone"].get("speedup") or 0 for k in labels]
        e2e = [rows[k]["end_to_end"].get("speedup") or 0 for k in labels]
        ax.bar([x - 0.2 for x in xs], alone, 0.4, label="model alone")
        ax.bar([x + 0.2 for x in xs], e2e, 0.4, label="end to end")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(list(xs), labels, rotation=20)
        ax.set_ylabel("speedup over eager fp32")
        ax.set_title(model)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
