"""The sweep's throughput-vs-p99 plot, as a PNG for docs/.

matplotlib is an optional dependency (``batchfleet[bench]``) and is imported
only here, with the non-interactive Agg backend, so a headless CI box works.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchfleet.bench.targets import P99_SLACK_MS

_MARKERS = "osD^v<>ph*"


def plot_sweep(points: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    sizes = sorted({p["max_batch_size"] for p in points})
    waits = sorted({p["max_wait_ms"] for p in points})
    cmap = plt.get_cmap("viridis", max(2, len(waits)))
    for i, size in enumerate(sizes):
        for j, wait in enumerate(waits):
            pts = [p for p in points if p["max_batch_size"] == size and p["max_wait_ms"] == wait]
            for p in pts:
                ax.scatter(p["throughput_rps"], p["p99_ms"], marker=_MARKERS[i % len(_MARKERS)],
                           color=cmap(j), s=70, edgecolors="black", linewidths=0.5,
                           label=f"batch {size}, wait {wait:g} ms")
                ax.annotate(f"{size}/{wait:g}", (p["throughput_rps"], p["p99_ms"]),
                            textcoords="offset points", xytext=(6, 4), fontsize=8)
    for k, wait in enumerate(waits):
        ax.axhline(wait + P99_SLACK_MS, color=cmap(k), linewidth=0.8, linestyle=":",
                   label=f"p99 goal for wait {wait:g} ms ({wait + P99_SLACK_MS:g} ms)")
    ax.set_yscale("log")
    ax.set_xlabel("saturation throughput, closed loop (requests/s)")
    ax.set_ylabel(f"p99 at {points[0]['load']:.0%} of saturation, open loop, "
                  f"{points[0].get('submit_mode', 'per-request')} submits (ms)"
                  if points else "p99 latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=7, ncol=2, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
