"""``batchfleet models check`` (docs/models.md, "Check it"): its steps as functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchfleet import ModelHandler, TensorSpec
from batchfleet.schemas.errors import (
    ConfigError,
    InvalidInputError,
    OutputMismatchError,
    ValidationError,
)
from batchfleet.workers.models.check import check_model, named_spec, read_inputs

pytestmark = pytest.mark.unit


class WrongOutput(ModelHandler):
    """Says it returns float32[2], returns float32[3]; refuses rows past 100."""

    input_spec = TensorSpec("float32", (3,))
    output_spec = TensorSpec("float32", (2,))

    def validate(self, inputs: Any) -> None:
        if float(np.max(inputs)) > 100:
            raise InvalidInputError("past 100")

    def predict(self, batch: Any) -> Any:
        return batch


def wrong_output() -> WrongOutput:
    return WrongOutput()


def test_a_spec_is_named_as_on_worker_model() -> None:
    assert named_spec("demo-mlp") == "demo-mlp=demo-mlp"
    assert named_spec("demo-mlp:seed=2") == "demo-mlp=demo-mlp:seed=2"
    assert named_spec("clf=textclf.model:build") == "clf=textclf.model:build"
    assert named_spec("textclf.model:build") == "textclf=textclf.model:build"
    assert named_spec("models/net.pt2") == "net=models/net.pt2"


def test_a_built_in_is_loaded_warmed_run_and_timed() -> None:
    report = check_model("demo-mlp", batch_sizes=(1, 8, 500))
    body = report.as_dict()
    assert body["model"] == "demo-mlp" and body["input_spec"] == "float32[10]"
    assert body["inputs"] == 4 and len(body["outputs"]) == 4
    assert all(len(o) == 1 and 0 < o[0] < 1 for o in body["outputs"])  # a sigmoid
    assert sorted(report.batch_s) == [1, 8, 64]  # capped at the max batch size
    assert report.load_s > 0 and report.setup_s > 0
    json.dumps(body)  # what -o json prints


def test_a_plain_module_needs_a_spec_or_inputs_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        check_model("torch.nn:Identity")
    assert "--input-spec DTYPE[SHAPE]" in str(refused.value) and "--input-file" in str(
        refused.value) and "\n" not in str(refused.value)
    report = check_model("torch.nn:Identity", input_spec=TensorSpec("float32", (3,)))
    assert report.model == "torch" and np.asarray(report.outputs[0]).shape == (3,)
    rows = tmp_path / "rows.npy"
    np.save(rows, np.arange(6, dtype=np.float32).reshape(2, 3))
    report = check_model("id=torch.nn:Identity", inputs=read_inputs(rows), batch_sizes=(4,))
    assert [np.asarray(o).tolist() for o in report.outputs] == [[0, 1, 2], [3, 4, 5]]
    listed = tmp_path / "rows.json"
    listed.write_text("[[1.5, 2.5]]")
    assert read_inputs(listed)[0].tolist() == [1.5, 2.5]


def test_specs_and_hooks_are_checked_as_a_worker_would() -> None:
    spec = f"bad={__name__}:wrong_output"
    with pytest.raises(OutputMismatchError, match=r"output_spec float32\[2\]"):
        check_model(spec)
    with pytest.raises(InvalidInputError, match="past 100"):
        check_model(spec, inputs=[np.full(3, 101, np.float32)])
    with pytest.raises(ValidationError, match=r"wrong shape: expected float32\[3\]"):
        check_model(spec, inputs=[np.ones(4, np.float32)])


def test_a_warm_up_failure_is_one_line_naming_the_model_and_the_fix(tmp_path: Path) -> None:
    """A torch.export file with a static batch dimension fails its warm-up at batch 1: the
    worker and ``models check`` stop with one line saying how to export it."""
    import torch

    exported = torch.export.export(torch.nn.Linear(10, 4), (torch.zeros(2, 10),))
    path = tmp_path / "static.pt2"
    torch.export.save(exported, str(path))
    with pytest.raises(ConfigError) as refused:
        check_model(str(path), input_spec=TensorSpec("float32", (10,)))
    line = str(refused.value)
    assert line.startswith("model 'static': set-up or warm-up (batches of 1, 8) failed")
    assert "Dim('batch')" in line and "\n" not in line
