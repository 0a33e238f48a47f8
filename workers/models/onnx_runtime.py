"""ONNX Runtime execution: export a torch model, quantize it, run it on whole batches.

``onnx`` and ``onnxruntime`` come with the ``batchfleet[runtimes]`` extra and are
imported only here, only when a model asks for ``--runtime onnx``. The export uses
TorchScript-based ``torch.onnx.export(dynamo=False)`` with a dynamic batch axis: it
needs no ``onnxscript`` and exports ``nn.TransformerEncoder`` in about a second.
INT8 is ONNX Runtime's maintained ``quantize_dynamic`` (linear layers' weights to
7-bit int8, activations quantized per batch; :func:`quantize_int8` says why 7 bits).
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.tensor_spec import TensorSpec

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(bool)": "bool",
}


def onnx_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


def require_onnx(model: str) -> None:
    if not onnx_available():
        raise ConfigError(f"model {model!r}: --runtime onnx needs onnx and onnxruntime "
                          "(pip install 'batchfleet[runtimes]')")


def file_version(path: Path) -> str:
    """A short content hash of an ``.onnx`` file, as ``weights_version`` is for modules."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def export(module: torch.nn.Module, sample: torch.Tensor, path: Path) -> Path:
    """Export ``module`` to ``path`` with a dynamic batch axis (input ``input``)."""
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module, (sample,), str(path), input_names=["input"], output_names=["output"],
                dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                opset_version=17, dynamo=False)
        except Exception as exc:  # the exporter raises many types for unsupported ops
            raise ConfigError(f"cannot export to ONNX: {type(exc).__name__}: {exc}") from exc
    return path


def quantize_int8(source: Path, target: Path) -> Path:
    """Dynamic INT8 quantization of the linear layers (ONNX Runtime's maintained path).

    Weights are quantized to 7 bits (``reduce_range=True``) so the result does not
    depend on which x86 CPU runs it. ONNX Runtime's uint8 x int8 kernel on AVX2
    without VNNI multiplies with ``vpmaddubsw``, which sums each pair of products
    into a saturating int16: two full-range products (255 * 127 * 2 = 64770) overflow
    it, and the clipped sums silently corrupt the output. On such a CPU full 8-bit
    weights put demo-mlp at 1.36 and demo-encoder at 0.42 x their outputs' std (the
    int8 gate is 0.15), while a VNNI CPU (int32 accumulation) passes the same file.
    With 7-bit weights (|w| <= 64) a pair is at most 255 * 64 * 2 = 32640 and never
    saturates: one bit of weight precision keeps every x86 host inside the gate (on
    the AVX2 host: demo-mlp 0.06-0.08, demo-encoder 0.04). This is the setting ONNX
    Runtime's quantization guide gives for non-VNNI x86; ``per_channel`` stays off,
    the faster CPU choice. Without it the gate still catches the damage, but only
    by refusing to start, and only on the hosts that lack VNNI.
    """
    import logging

    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantType,
        quantize_dynamic,
    )

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "consider pre-processing" on every call
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8,
                         per_channel=False, reduce_range=True)
    finally:
        root.setLevel(level)
    return target


class OnnxSession:
    """One ``InferenceSession`` with a single batched input and output.

    The execution provider follows the device: CUDA where it is present and the
    runtime has it, the CPU provider otherwise. Intra-op threads follow torch's, so
    the two runtimes compete on equal terms.
    """

    def __init__(self, path: Path, device: torch.device) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        # Idle intra-op threads would spin-wait for the next run, taking the cores the
        # worker's event loop needs between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ConfigError(f"cannot load {path} in ONNX Runtime: {exc}") from exc
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1:
            raise ConfigError(f"{path}: batchfleet runs ONNX models with one input and one "
                              f"output; this one has {len(inputs)} and {len(outputs)}")
        self.input_name: str = inputs[0].name
        self.output_name: str = outputs[0].name
        self.providers: list[str] = list(self.session.get_providers())
        self._input = inputs[0]

    def input_spec(self) -> TensorSpec | None:
        """The per-row spec when the file pins it (static dims after the batch axis)."""
        dtype = _ORT_TYPES.get(self._input.type)
        dims: list[Any] = list(self._input.shape)[1:]
        if dtype is None or not all(isinstance(d, int) for d in dims):
            return None
        return TensorSpec(dtype, tuple(dims))

    def run(self, batch: np.ndarray) -> np.ndarray:
        out = self.session.run([self.output_name], {self.input_name: batch})[0]
        return np.asarray(out)


def build_session(module: torch.nn.Module | None, source: Path | None, sample: torch.Tensor,
                  precision: str, device: torch.device, workdir: Path | None = None
                  ) -> OnnxSession:
    """Export ``module`` (or take ``source``), quantize it for int8, open the session."""
    folder = workdir or Path(tempfile.mkdtemp(prefix="batchfleet-onnx-"))
    path = source
    if path is None:
        assert module is not None
        path = export(module, sample, folder / "model.onnx")
    if precision == "int8":
        path = quantize_int8(path, folder / "model-int8.onnx")
    return OnnxSession(path, device)


class OnnxModule(torch.nn.Module):
    """An ONNX session seen as a module: the fp32 reference for a user's ``.onnx`` file."""

    def __init__(self, session: OnnxSession) -> None:
        super().__init__()
        self.session = session

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(batch.detach().cpu().numpy()))
