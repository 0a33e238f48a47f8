"""The accuracy gate: a faster runtime is compared with eager fp32 before it serves.

At start-up a non-eager runtime or reduced precision runs the same calibration rows
as the eager fp32 model (seeded random inputs, or a ``.npy`` file). The differences
are measured relative to the spread (standard deviation) of the reference outputs,
so one tolerance means the same for a model whose outputs are probabilities and one
whose outputs are logits in the hundreds. Past the tolerance the worker refuses to
start, unless the operator accepted the loss explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.tensor_spec import TensorSpec

#: At least this many rows are compared (the issue's floor).
CALIBRATION_ROWS = 256
CALIBRATION_SEED = 20240616

#: Default tolerance per precision: the largest absolute difference allowed, as a
#: fraction of the reference outputs' standard deviation (docs/runtimes.md).
DEFAULT_TOLERANCE: dict[str, float] = {
    "fp32": 1e-3,
    "fp16": 2e-2,
    "bf16": 2.5e-1,
    "int8": 1.5e-1,
}

Forward = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class AccuracyReport:
    """How far a candidate's outputs are from the reference's on the calibration rows."""

    rows: int
    max_abs: float
    mean_abs: float
    reference_std: float

    @property
    def relative(self) -> float:
        """``max_abs`` in units of the reference outputs' spread."""
        return self.max_abs / self.reference_std if self.reference_std > 0 else (
            0.0 if self.max_abs == 0 else float("inf"))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "relative": self.relative}


def seeded_rows(spec: TensorSpec, rows: int = CALIBRATION_ROWS, seed: int = CALIBRATION_SEED,
                value_range: tuple[float, float] | None = None) -> np.ndarray:
    """``rows`` reproducible inputs matching ``spec``: integers uniform in ``value_range``
    (default ``[0, 2)``), floats standard normal (or uniform in ``value_range``)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(spec.dtype)
    shape = (rows, *spec.shape)
    if dtype.kind in "iub":
        low, high = value_range or (0, 2)
        return rng.integers(int(low), int(high), size=shape).astype(dtype)
    if value_range is not None:
        return rng.uniform(value_range[0], value_range[1], size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def load_calibration(path: Path, spec: TensorSpec | None) -> np.ndarray:
    """Rows from a ``.npy`` file: a batch ``[N, *shape]`` of the model's input dtype."""
    try:
        rows: np.ndarray = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--calibration {path}: cannot read it as .npy: {exc}") from exc
    if spec is not None and (tuple(rows.shape[1:]) != spec.shape
                             or rows.dtype != np.dtype(spec.dtype)):
        raise ConfigError(f"--calibration {path}: rows are {rows.dtype}{list(rows.shape)}; "
                          f"the model takes {spec.describe()} per row")
    if rows.ndim < 1 or rows.shape[0] < 1:
        raise ConfigError(f"--calibration {path}: no rows")
    return rows


def measure(reference: Forward, candidate: Forward, rows: np.ndarray,
            batch_size: int) -> AccuracyReport:
    """Run both forwards over ``rows`` in batches and compare the outputs."""
    ref_parts: list[np.ndarray] = []
    got_parts: list[np.ndarray] = []
    for start in range(0, rows.shape[0], batch_size):
        chunk = rows[start:start + batch_size]
        ref_parts.append(np.asarray(reference(chunk), dtype=np.float64))
        got_parts.append(np.asarray(candidate(chunk), dtype=np.float64))
    ref = np.concatenate(ref_parts)
    got = np.concatenate(got_parts)
    if ref.shape != got.shape:
        raise ConfigError(f"outputs differ in shape: reference {list(ref.shape)}, "
                          f"runtime {list(got.shape)}")
    diff = np.abs(ref - got)
    return AccuracyReport(rows=int(rows.shape[0]), max_abs=float(diff.max(initial=0.0)),
                          mean_abs=float(diff.mean()) if diff.size else 0.0,
                          reference_std=float(ref.std()))


def check(model: str, flavour: str, report: AccuracyReport, tolerance: float,
          accept_loss: bool) -> None:
    """Refuse to start (one line) when ``report`` is past ``tolerance``, unless accepted."""
    if report.relative <= tolerance or accept_loss:
        return
    raise ConfigError(
        f"model {model!r} on {flavour} is off eager fp32 by max-abs {report.max_abs:.3g}, "
        f"mean-abs {report.mean_abs:.3g} over {report.rows} rows ({report.relative:.3g} x the "
        f"outputs' std {report.reference_std:.3g}; tolerance {tolerance:g}): refusing to start "
        "(--accept-accuracy-loss overrides)")
