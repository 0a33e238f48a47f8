"""``batchfleet models baseline | outputs``: what each version answers, and its drift.

The statistics come from the workers (``workers/middleware/output_stats.py``), merged in
the control plane in time windows; ``connectors.output_report`` turns them into one row
per version. See docs/monitoring.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from batchfleet.connectors.output_report import (
    DEFAULT_SINCE_S,
    VersionRow,
    freeze_baseline,
    read_rows,
)
from batchfleet.connectors.output_summary import SeriesStats, bucket_value
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail, run_against
from batchfleet.output import Column, NoHeadersOpt, OutputOpt, output_format, render
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.schemas.settings import DEFAULT_NAMESPACE

SinceOpt = Annotated[float, typer.Option(
    "--since-s", metavar="SECONDS", min=1.0,
    help="The period the statistics cover, ending now: the windows (--stats-window-s "
         "of the workers, a minute by default) that end within it count whole.")]


def baseline(
    target: Annotated[str, typer.Argument(metavar="MODEL[@VERSION]",
                                          help="The model, and the version (default: the "
                                               "stable one).")],
    broker: BrokerOpt, results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, since_s: SinceOpt = DEFAULT_SINCE_S,
) -> None:
    """Freeze a version's output and input statistics over the last --since-s seconds as
    its reference: its drift is measured against this baseline from now on.

    Examples:

        batchfleet models baseline demo-mlp --since-s 3600

        batchfleet models baseline demo-mlp@v2
    """
    model, _, label = target.partition("@")

    async def go(plane: Any) -> tuple[str, int]:
        chosen = label
        if not chosen:
            policy = (await plane.models.policies([model])).get(model)
            chosen = policy.stable if policy is not None else DEFAULT_LABEL
        frozen = await freeze_baseline(plane, model, chosen, since_s)
        return chosen, frozen.sides["outputs"].rows

    chosen, rows = run_against(lambda plane: plane, broker, results, namespace, go)
    if not rows:
        raise fail(f"{model}@{chosen} has no statistics over the last {since_s:g} s: send "
                   "it traffic first (the baseline would be empty)", 1)
    typer.echo(f"baseline of {model}@{chosen} frozen: {rows} requests over the last "
               f"{since_s:g} s")


def _num(value: Any) -> str:
    return "—" if value is None else f"{value:.4g}"


COLUMNS = (Column("version"), Column("role"), Column("reference", show=lambda v: v or "—"),
           Column("count"), Column("nan_rate", "nan rate", show=_num),
           Column("mean", show=_num), Column("p50", show=_num), Column("p99", show=_num),
           Column("psi", show=_num), Column("ks", show=_num),
           Column("in_psi", "input psi", wide=True, show=_num),
           Column("in_ks", "input ks", wide=True, show=_num),
           Column("in_shift", "input shift", wide=True, show=_num))


def outputs(
    model: Annotated[str, typer.Argument(help="The model's name.")],
    broker: BrokerOpt, results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, since_s: SinceOpt = DEFAULT_SINCE_S,
    inputs: Annotated[bool, typer.Option(
        "--inputs", help="Also show the inputs' statistics and drift (under `inputs` in "
        "JSON; input psi, ks and shift columns in the table: shift is the largest move of "
        "one feature's mean, in the reference's standard deviations).")] = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Draw each version's output distribution over its reference to this "
        "file (PNG, SVG or PDF; needs matplotlib: the bench extra).")] = None,
    output: OutputOpt = "table", no_headers: NoHeadersOpt = False, as_json: JsonOpt = False,
) -> None:
    """One row per version: values counted, NaN rate, mean, p50, p99, and drift (PSI, KS)
    against its reference (its baseline; else, for any version but stable, stable over the
    same period; else none). Drift stays empty until both sides hold 2,000 values.

    Examples:

        batchfleet models outputs demo-mlp

        batchfleet models outputs demo-mlp --inputs -o wide

        batchfleet models outputs demo-mlp --json --plot outputs.png
    """
    fmt = output_format(output, as_json)
    found: list[VersionRow] = run_against(
        lambda plane: plane, broker, results, namespace,
        lambda plane: read_rows(plane, model, since_s))
    body = [r.to_json(inputs=inputs) for r in found]
    if plot is not None:
        draw(model, found, plot)
    rows = [{**b, "in_psi": r.inputs.drift["psi"], "in_ks": r.inputs.drift["ks"],
             "in_shift": r.inputs.drift["mean_shift"]} for b, r in zip(body, found, strict=True)]
    columns = COLUMNS if inputs else COLUMNS[:-3]
    wide = "wide" if fmt == "wide" or (inputs and fmt == "table") else fmt
    render(rows, columns, wide, no_headers, title=f"{model}: outputs over the last "
           f"{since_s:g} s", body=body)
    if plot is not None and fmt not in ("json", "yaml"):
        typer.echo(f"plot written to {plot}")


def _curve(stats: SeriesStats) -> tuple[list[float], list[float]]:
    total = sum(stats.buckets.values()) or 1
    xs, ys, seen = [], [], 0
    for b in sorted(stats.buckets):
        seen += stats.buckets[b]
        xs.append(bucket_value(b))
        ys.append(seen / total)
    return xs, ys


def draw(model: str, rows: list[VersionRow], path: Path) -> None:
    """Each version's output CDF (its first series) over its reference's, one panel each."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        raise fail("--plot needs matplotlib: pip install 'batchfleet[bench]'", 1) from exc
    fig, axes = plt.subplots(1, max(1, len(rows)), figsize=(5 * max(1, len(rows)), 4),
                             squeeze=False)
    for ax, row in zip(axes[0], rows, strict=False):
        primary = row.outputs.summary.primary()
        if primary is not None:
            ax.plot(*_curve(primary[1]), drawstyle="steps-post", label=row.version)
            ref = row.outputs.ref.series.get(primary[0]) if row.outputs.ref else None
            if ref is not None:
                ax.plot(*_curve(ref), drawstyle="steps-post", linestyle="--",
                        label=row.outputs.reference)
        ax.set(title=f"{model}@{row.version} ({row.role}); reference: "
                     f"{row.outputs.reference or 'none'}", xlabel="output value",
               ylabel="share at or below")
        ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise fail(f"cannot write the plot to {path}: {exc}", 1) from exc
    finally:
        plt.close(fig)
