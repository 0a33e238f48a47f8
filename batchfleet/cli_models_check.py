"""``batchfleet models check SPEC``: load a model locally and try it, with no broker.

The command's options and its printing; the work is ``workers.models.check`` (imported
when the command runs, so ``batchfleet --help`` stays light).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from batchfleet.options import JsonOpt, fail
from batchfleet.output import Column, OutputOpt, console, dump, output_format, table
from batchfleet.schemas.errors import BatchfleetError
from batchfleet.schemas.settings import APP_DIR
from batchfleet.settings_options import shared_info

#: Output rows printed in the table form (``-o json`` has them all).
SHOWN_OUTPUTS = 4


def check(
    spec: Annotated[str, typer.Argument(
        metavar="SPEC", help="The model, as on `worker --model`, with or without NAME=: "
        "demo-mlp, [NAME=]module:factory, [NAME=]path/model.pt or .pt2.")],
    input_spec: Annotated[str | None, typer.Option(
        "--input-spec", metavar="DTYPE[SHAPE]",
        help="What the model takes per request, e.g. float32[10]; a model that says it "
             "itself needs none.")] = None,
    input_file: Annotated[Path | None, typer.Option(
        "--input-file", metavar="FILE",
        help="Sample inputs: a .npy batch (one row per request) or a .json list of them. "
             "Default: 4 seeded rows generated from the input spec.")] = None,
    app_dir: Annotated[str, shared_info(APP_DIR)] = "",
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")] = "cpu",
    batch_sizes: Annotated[str, typer.Option(
        "--batch-sizes", metavar="N,N,...", help="Batch sizes to time.")] = "1,8,32",
    output: OutputOpt = "table", as_json: JsonOpt = False,
) -> None:
    """Load a model as a worker would, warm it up, run one batch of sample inputs through
    its specs and hooks, and print the outputs, the load time and the time per batch at a
    few batch sizes. No broker or store is needed (docs/models.md, "Check it").

    Examples:

        batchfleet models check demo-mlp

        batchfleet models check textclf.model:build

        batchfleet models check net=model.pt2 --input-spec float32[3,32,32] -o json

        batchfleet models check mypkg.models:build --input-file rows.npy
    """
    from batchfleet.workers.models.check import check_model, read_inputs
    from batchfleet.workers.models.loading import add_app_dir

    fmt = output_format(output, as_json)
    try:
        sizes = tuple(int(s) for s in batch_sizes.split(",") if s.strip())
    except ValueError:
        raise fail(f"--batch-sizes {batch_sizes!r}: expected whole numbers, e.g. 1,8,32") from None
    try:
        from batchfleet.schemas.tensor_spec import TensorSpec

        add_app_dir(app_dir or None)
        given = TensorSpec.parse(input_spec) if input_spec else None
        inputs = read_inputs(input_file) if input_file is not None else None
        report = check_model(spec, input_spec=given, inputs=inputs, device=device,
                             batch_sizes=sizes)
    except BatchfleetError as exc:
        raise fail(str(exc)) from exc
    body = report.as_dict()
    if fmt in ("json", "yaml"):
        dump(body, fmt)
        return
    _print(body)


def _print(body: dict[str, Any]) -> None:
    out = console()
    out.print(f"{body['model']} (version {body['version']}): loaded in "
              f"{body['load_s'] * 1000:.1f} ms, set up and warmed in "
              f"{body['setup_s'] * 1000:.1f} ms")
    out.print(f"input {body['input_spec'] or 'any'}, output {body['output_spec'] or 'any'}: "
              f"{body['inputs']} sample inputs passed the specs and hooks")
    rows = [{"row": i, "output": _short(o)} for i, o in enumerate(body["outputs"])]
    out.print(table(rows[:SHOWN_OUTPUTS], (Column("row"), Column("output")), title="outputs"))
    if len(rows) > SHOWN_OUTPUTS:
        out.print(f"... {len(rows) - SHOWN_OUTPUTS} more (-o json shows all)")
    timing = [{"batch": size, "ms": ms, "per_request_ms": round(ms / int(size), 3)}
              for size, ms in body["batch_ms"].items()]
    out.print(table(timing, (Column("batch", "batch size"), Column("ms", "ms per batch"),
                             Column("per_request_ms", "ms per request")),
                    title="time per batch (median)"))


def _short(value: Any, limit: int = 80) -> str:
    text = str(_rounded(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _rounded(value: Any) -> Any:
    """Floats to 4 significant digits, for the table only (``-o json`` keeps them whole)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
