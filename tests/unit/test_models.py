from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from batchfleet.schemas.errors import ConfigError, ModelError, OutputMismatchError, ValidationError
from batchfleet.workers.models import TensorSpec, check_inputs, load_model, parse_model_spec
from batchfleet.workers.runner import ModelRunner, bisect_run

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")


def test_demo_mlp_is_reproducible_across_builds() -> None:
    a, b = load_model("demo-mlp"), load_model("demo-mlp")
    assert a.version == b.version
    x = [np.linspace(0, 1, 10, dtype=np.float32)]
    for h in (a, b):
        h.setup(CPU)
    out_a = a.postprocess(a.predict(a.preprocess(x)), 1)[0]
    out_b = b.postprocess(b.predict(b.preprocess(x)), 1)[0]
    assert isinstance(out_a, np.ndarray) and out_a.shape == (1,) and out_a.dtype == np.float32
    np.testing.assert_array_equal(out_a, out_b)
    assert 0.0 < float(out_a[0]) < 1.0  # sigmoid head


def test_model_specs() -> None:
    assert parse_model_spec("demo-mlp") == ("demo-mlp", "demo-mlp")
    assert parse_model_spec("fraud=pkg.mod:make") == ("fraud", "pkg.mod:make")
    assert load_model("scorer=demo-mlp").name == "scorer"
    for bad in ("", "x=", "nope", "bad name=demo-mlp", "m=missing.module:f", "m=/no/such.pt"):
        with pytest.raises(ConfigError):
            load_model(bad)


def test_user_factory_and_torchscript_file(tmp_path: Path) -> None:
    handler = load_model("p=tests.support.models:poison_model")
    assert handler.name == "p" and handler.input_spec == TensorSpec("float32", (10,))
    path = tmp_path / "m.pt"
    torch.jit.script(torch.nn.Linear(3, 2)).save(str(path))  # type: ignore[no-untyped-call]
    scripted = load_model(f"lin={path}")
    scripted.setup(CPU)
    out = scripted.postprocess(scripted.predict(scripted.preprocess(
        [np.ones(3, np.float32)] * 4)), 4)
    assert len(out) == 4 and out[0].shape == (2,)  # type: ignore[union-attr]
    exported = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(3, 2), (torch.ones(2, 3),)),
                      str(exported))
    from_export = load_model(f"ex={exported}")
    from_export.setup(CPU)
    out = from_export.postprocess(from_export.predict(from_export.preprocess(
        [np.ones(3, np.float32)] * 2)), 2)
    assert len(out) == 2


def test_input_spec_names_the_mismatch() -> None:
    spec = TensorSpec("float32", (10,))
    check_inputs(spec, np.zeros(10, np.float32))
    with pytest.raises(ValidationError, match="wrong dtype: expected float32, got float64"):
        check_inputs(spec, np.zeros(10, np.float64))
    with pytest.raises(ValidationError, match=r"wrong shape: expected float32\[10\]"):
        check_inputs(spec, np.zeros(3, np.float32))
    with pytest.raises(ValidationError, match="named tensors"):
        check_inputs(spec, {"x": np.zeros(10, np.float32)})


def test_bisect_isolates_exactly_the_bad_items() -> None:
    calls = []

    def run(items: list[int]) -> list[int]:
        calls.append(len(items))
        if 13 in items or 40 in items:
            raise ValueError("bad")
        return [i * 2 for i in items]

    out = bisect_run(run, list(range(64)))
    bad = [i for i, o in enumerate(out) if isinstance(o, BaseException)]
    assert bad == [13, 40]
    assert out[0] == 0 and out[63] == 126
    assert len(calls) < 64  # logarithmic, not one forward per item


def test_runner_turns_failures_into_typed_errors_per_request() -> None:
    runner = ModelRunner({"poison": load_model("poison=tests.support.models:poison_model"),
                          "short": load_model("short=tests.support.models:wrong_count_model")},
                         CPU)
    runner.setup()
    rows = [np.full(10, 0.5, np.float32) for _ in range(8)]
    rows[3] = np.full(10, -999.0, np.float32)
    run = runner.run("poison", rows)
    errors = [i for i, o in enumerate(run.outputs) if isinstance(o, ModelError)]
    assert errors == [3]
    assert "poison input" in str(run.outputs[3])
    short = runner.run("short", [np.ones(10, np.float32)] * 2)
    assert all(isinstance(o, OutputMismatchError) for o in short.outputs)


def test_encoder_validate_refuses_tokens_outside_the_vocabulary() -> None:
    from batchfleet.schemas.errors import InvalidInputError
    from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN, ENCODER_VOCAB

    handler = load_model("demo-encoder")
    ok = np.full(ENCODER_SEQ_LEN, ENCODER_VOCAB - 1, np.int64)
    handler.validate(ok)  # type: ignore[attr-defined]
    for bad in (ENCODER_VOCAB, ENCODER_VOCAB + 5000, -1):
        tokens = ok.copy()
        tokens[7] = bad
        with pytest.raises(InvalidInputError, match=r"\[0, 1024\)") as caught:
            handler.validate(tokens)  # type: ignore[attr-defined]
        assert caught.value.wire_type == "validation_error" and not caught.value.retryable
        assert isinstance(caught.value, ValidationError)


def test_invalid_input_raised_in_predict_is_pinned_and_not_retryable() -> None:
    from batchfleet.schemas.errors import InvalidInputError

    def run(items: list[int]) -> list[int]:
        if 3 in items:
            raise InvalidInputError("3 is not allowed")
        return items

    out = bisect_run(run, [1, 2, 3, 4])
    assert out[:2] == [1, 2] and out[3] == 4
    assert isinstance(out[2], InvalidInputError) and not out[2].retryable
