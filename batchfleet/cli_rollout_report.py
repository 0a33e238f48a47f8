"""``batchfleet rollout report MODEL``: how the shadow version compares with stable.

Registered on the ``rollout`` group by ``cli_rollout``. Reads the comparisons workers
flush (``connectors.rollout_stats``): requests compared, skipped and failed, the
output difference, arg-max agreement and each version's compute latency. ``--plot``
draws the difference histogram and both latency CDFs with matplotlib, imported only
then (it comes with the ``bench`` extra). ``-o json`` (``--json``) and ``-o yaml`` carry
the report document; the table has no header row, and ``--no-headers`` drops its
headline too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from batchfleet.connectors.rollout_stats import ShadowReport
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail, open_doors
from batchfleet.output import Column, NoHeadersOpt, OutputOpt, console, dump, output_format, table
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.settings import DEFAULT_NAMESPACE


def report(
    model: Annotated[str, typer.Argument(help="The model's name.")], broker: BrokerOpt,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Also draw the difference histogram and latency CDFs to this file "
        "(PNG, SVG or PDF; needs matplotlib: the bench extra).")] = None,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False,
    output: OutputOpt = "table", no_headers: NoHeadersOpt = False,
) -> None:
    """Compare the shadow version with stable: requests compared and skipped, max and mean
    absolute output difference, arg-max agreement, compute p50/p99 of each version (since
    the current policy epoch began).

    Examples:

        batchfleet rollout report demo-mlp

        batchfleet rollout report demo-mlp --json --plot shadow.png

        batchfleet rollout report demo-mlp -o yaml
    """
    output = output_format(output, as_json)

    async def read() -> ShadowReport | None:
        plane, _ = open_doors(broker, results, namespace)
        try:
            return await plane.rollout_stats.read_comparisons(model)
        finally:
            await plane.close()

    try:
        found = asyncio.run(read())
    except BatchfleetError as exc:
        raise fail(str(exc), 1) from exc
    if found is None:
        raise fail(f"model {model!r} has no shadow comparisons yet: set a shadow with "
                   f"`batchfleet rollout set {model} --stable V --shadow V2` and send traffic",
                   1)
    if plot is not None:
        draw(found, plot)
    body = found.to_json()
    if output in ("json", "yaml"):
        dump({**body, "plot": None if plot is None else str(plot)}, output)
        return
    _print(body, no_headers)
    if plot is not None:
        typer.echo(f"plot written to {plot}")


def _print(body: dict[str, Any], no_headers: bool = False) -> None:
    out = console()
    if not no_headers:
        out.print(f"{body['model']}: shadow {body['shadow']} against stable {body['stable']} "
                  f"(epoch {body['epoch']})")
    shown = (("compared", body["compared"]), ("skipped (backpressure)", body["skipped"]),
             ("errors", body["errors"]), ("max abs diff", body["max_abs_diff"]),
             ("mean abs diff", body["mean_abs_diff"]),
             ("arg-max agreement", None if body["agreement_rate"] is None
              else f"{body['agreement_rate']:.2%}"))
    rows = [{"what": what, "value": "—" if value is None else str(value)}
            for what, value in shown]
    rows += [{"what": f"{role} compute p50 / p99 ms",
              "value": f"{_ms(lat['p50'])} / {_ms(lat['p99'])} over {lat['batches']} batches"}
             for role, lat in body["latency_ms"].items()]
    out.print(table(rows, (Column("what"), Column("value")), no_headers=True))


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def draw(found: ShadowReport, path: Path) -> None:
    """The difference histogram and both versions' latency CDFs, side by side."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        raise fail("--plot needs matplotlib: pip install 'batchfleet[bench]'", 1) from exc
    fig, (diffs, cdf) = plt.subplots(1, 2, figsize=(11, 4))
    diffs.hist(found.diffs or [0.0], bins=40)
    diffs.set(title=f"{found.model}: |shadow - stable| per request (max)",
              xlabel="max abs difference", ylabel="requests")
    for role, label in (("stable", found.stable), ("shadow", found.shadow)):
        samples = sorted(found.samples.get(role) or [])
        if samples:
            cdf.plot(samples, [(i + 1) / len(samples) for i in range(len(samples))],
                     label=f"{role} ({label})", drawstyle="steps-post")
    cdf.set(title="compute latency per batch", xlabel="ms", ylabel="share of batches")
    cdf.legend(loc="lower right")
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise fail(f"cannot write the plot to {path}: {exc}", 1) from exc
    finally:
        plt.close(fig)
