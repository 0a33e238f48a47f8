"""Runtimes and the accuracy gate on the CPU: ONNX Runtime fp32/int8, bf16, refusals."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.models import accuracy, load_model, onnx_runtime
from batchfleet.workers.models.handler import TensorSpec
from batchfleet.workers.models.runtimes import RuntimeChoice, RuntimeHandler
from batchfleet.workers.runner import ModelRunner
from batchfleet.workers.settings import WorkerSettings

pytestmark = pytest.mark.unit
CPU = torch.device("cpu")
ROWS = [np.linspace(-1, 1, 10, dtype=np.float32) * i for i in range(5)]


def outputs(handler: object, rows: list[np.ndarray]) -> np.ndarray:
    runner = ModelRunner({"m": handler}, CPU)  # type: ignore[dict-item]
    run = runner.run("m", rows)
    return np.stack([np.asarray(o) for o in run.outputs])


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_onnx_matches_eager_within_the_gate(precision: str) -> None:
    eager = load_model("m=demo-mlp")
    fast = load_model("m=demo-mlp", 8, RuntimeChoice("onnx", precision))
    for h in (eager, fast):
        h.setup(CPU)
    assert isinstance(fast, RuntimeHandler) and fast.accuracy is not None
    assert fast.accuracy.rows >= accuracy.CALIBRATION_ROWS
    assert fast.accuracy.relative <= accuracy.DEFAULT_TOLERANCE[precision]
    info = fast.info()
    assert info["runtime"] == "onnx" and info["accuracy"]["max_abs"] == fast.accuracy.max_abs
    # 5 rows run as a padded bucket of 8; exactly 5 results come back
    got, want = outputs(fast, ROWS), outputs(eager, ROWS)
    assert got.shape == want.shape == (5, 1)
    np.testing.assert_allclose(got, want, atol=1e-5 if precision == "fp32" else 1e-2)


def test_versions_differ_across_runtimes() -> None:
    versions = {load_model("demo-mlp", 8, RuntimeChoice(r, p)).version
                for r, p in [("eager", "fp32"), ("onnx", "fp32"), ("onnx", "int8"),
                             ("compile", "fp32"), ("eager", "bf16")]}
    assert len(versions) == 5
    base = load_model("demo-mlp").version
    assert f"{base}/onnx-int8" in versions
    assert all(v == base or v.startswith(base + "/") for v in versions)


@pytest.mark.parametrize(("runtime", "precision", "says"), [
    ("eager", "fp16", "needs CUDA"),
    ("compile", "int8", "use --runtime onnx"),
    ("onnx", "bf16", "ONNX runs fp32 or int8"),
])
def test_an_unavailable_combination_is_refused_in_one_line(
        runtime: str, precision: str, says: str) -> None:
    handler = load_model("demo-mlp", 8, RuntimeChoice(runtime, precision))
    with pytest.raises(ConfigError, match=says) as refused:
        handler.setup(CPU)
    assert "\n" not in str(refused.value)


def test_unknown_runtime_or_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--runtime"):
        RuntimeChoice("tensorrt")
    with pytest.raises(ConfigError, match="--precision"):
        RuntimeChoice("onnx", "int4")


def test_the_gate_refuses_a_broken_export(monkeypatch: pytest.MonkeyPatch) -> None:
    real_export = onnx_runtime.export

    def broken_export(module: torch.nn.Module, sample: torch.Tensor, path: Path) -> Path:
        damaged = copy.deepcopy(module)
        with torch.no_grad():
            for p in damaged.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return real_export(damaged, sample, path)

    monkeypatch.setattr(onnx_runtime, "export", broken_export)
    handler = load_model("m=demo-mlp", 8, RuntimeChoice("onnx"))
    with pytest.raises(ConfigError, match=r"max-abs \S+, mean-abs \S+ over 256 rows") as refused:
        handler.setup(CPU)
    assert "\n" not in str(refused.value) and "--accept-accuracy-loss" in str(refused.value)
    # the operator may accept it; the measured loss is still reported
    accepted = load_model("m=demo-mlp", 8, RuntimeChoice("onnx", accept_accuracy_loss=True))
    accepted.setup(CPU)
    assert isinstance(accepted, RuntimeHandler) and accepted.accuracy is not None
    assert accepted.accuracy.relative > accuracy.DEFAULT_TOLERANCE["fp32"]


def test_a_user_onnx_file_loads_and_quantizes(tmp_path: Path) -> None:
    path = onnx_runtime.export(load_model("demo-mlp").module,  # type: ignore[attr-defined]
                               torch.zeros(2, 10), tmp_path / "scorer.onnx")
    eager = load_model("demo-mlp")
    eager.setup(CPU)
    fp32 = load_model(f"scorer={path}", 8)
    int8 = load_model(f"scorer={path}", 8, RuntimeChoice(precision="int8"))
    for h in (fp32, int8):
        h.setup(CPU)
        assert h.input_spec == TensorSpec("float32", (10,))
        np.testing.assert_allclose(outputs(h, ROWS), outputs(eager, ROWS), atol=1e-2)
    assert fp32.version.endswith("/onnx-fp32") and int8.version.endswith("/onnx-int8")
    assert fp32.version.split("/")[0] == int8.version.split("/")[0] != eager.version
    with pytest.raises(ConfigError, match="compile needs a torch model"):
        load_model(f"scorer={path}", 8, RuntimeChoice("compile"))
    # --input-spec: the file's own spec may be restated, not contradicted
    assert load_model(f"scorer={path}", 8, input_spec=TensorSpec("float32", (10,))).input_spec
    with pytest.raises(ConfigError, match=r"takes float32\[10\]; --input-spec float32\[9\]"):
        load_model(f"scorer={path}", 8, input_spec=TensorSpec("float32", (9,)))


def test_int8_weights_cannot_saturate_the_avx2_kernel(tmp_path: Path) -> None:
    """Holds on any host: on an AVX2 CPU without VNNI, ONNX Runtime's u8 x s8 kernel
    sums pairs of products into a saturating int16, so the gate only fails there.
    This checks the cause itself: every int8 weight is 7-bit, and a pair of
    full-scale uint8 activations times the largest weight fits in int16."""
    import onnx
    from onnx import numpy_helper

    source = onnx_runtime.export(load_model("demo-mlp").module,  # type: ignore[attr-defined]
                                 torch.zeros(2, 10), tmp_path / "m.onnx")
    quantized = onnx_runtime.quantize_int8(source, tmp_path / "m-int8.onnx")
    weights = [numpy_helper.to_array(t) for t in onnx.load(str(quantized)).graph.initializer]
    int8 = [w for w in weights if w.dtype == np.int8 and w.size > 1]
    assert len(int8) == 3  # the three Linear layers, the output layer included
    largest = max(int(np.abs(w.astype(np.int32)).max()) for w in int8)
    assert largest <= 64 and 2 * 255 * largest <= np.iinfo(np.int16).max


def test_calibration_file_is_used_and_checked(tmp_path: Path) -> None:
    spec = TensorSpec("float32", (10,))
    good = tmp_path / "rows.npy"
    np.save(good, accuracy.seeded_rows(spec, 300, seed=1))
    handler = load_model("demo-mlp", 8, RuntimeChoice("onnx", calibration=good))
    handler.setup(CPU)
    assert isinstance(handler, RuntimeHandler) and handler.accuracy is not None
    assert handler.accuracy.rows == 300
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(ConfigError, match="the model takes float32"):
        load_model("demo-mlp", 8, RuntimeChoice("onnx", calibration=bad)).setup(CPU)


def test_measure_and_check_are_relative_to_the_reference_spread() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    report = accuracy.measure(lambda x: x * 100, lambda x: x * 100 + 1, rows, batch_size=4)
    assert report.rows == 6 and report.max_abs == pytest.approx(1.0)
    assert report.relative == pytest.approx(1.0 / float((rows * 100).std()))
    accuracy.check("m", "onnx-fp32", report, tolerance=0.01, accept_loss=False)
    with pytest.raises(ConfigError, match="refusing to start"):
        accuracy.check("m", "onnx-fp32", report, tolerance=1e-4, accept_loss=False)
    ints = accuracy.seeded_rows(TensorSpec("int64", (4,)), value_range=(0, 7))
    assert ints.shape == (256, 4) and ints.min() >= 0 and ints.max() < 7
    np.testing.assert_array_equal(ints, accuracy.seeded_rows(TensorSpec("int64", (4,)),
                                                             value_range=(0, 7)))


def test_settings_resolve_per_model_runtime_choices() -> None:
    from batchfleet.workers.per_model import parse_per_model

    settings = WorkerSettings.from_url(
        "redis://localhost:6379/0", models=("demo-mlp", "demo-encoder"),
        runtime=parse_per_model(["demo-encoder=onnx"], str, "eager"),
        precision=parse_per_model(["int8"], str, "fp32"))
    enc, mlp = settings.runtime_for("demo-encoder"), settings.runtime_for("demo-mlp")
    assert (enc.runtime, enc.precision, enc.label) == ("onnx", "int8", "onnx-int8")
    assert (mlp.runtime, mlp.precision) == ("eager", "int8")


def test_bench_lists_what_the_device_runs_and_why_not_the_rest() -> None:
    from batchfleet.bench.runtimes import available

    runnable, refused = available("demo-encoder", CPU)
    labels = [c.label for c in runnable]
    assert labels[0] == "eager-fp32" and "onnx-int8" in labels and "compile-fp32" in labels
    assert "eager-fp16" not in labels and "needs CUDA" in refused["eager-fp16"]
