"""``.npy`` output: the outputs array plus a status array, row ``i`` for input row ``i``.

``OUTPUT.npy`` has shape ``(rows, *output_shape)`` in the model's output dtype;
a failed row holds NaN (0 for integer outputs). ``OUTPUT.status.npy`` is
uint8, one per row: 0 not written yet, 1 succeeded, 2 failed, 3 expired. Both
are memory maps created at full size, so writing row ``i`` is a store into
the map, a checkpoint is an ``msync``, and a resume just reopens them: memory
stays flat and there is nothing to truncate. The outputs array is created
when the first row succeeds, because only then are its shape and dtype known
(so a job in which no row succeeded leaves only the status array).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.lib.format import open_memmap

from batchfleet.producers.bulk.errors import BulkError
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sinks import SinkBase
from batchfleet.producers.bulk.spec import JobSpec
from batchfleet.schemas.envelopes import ErrorInfo, Result

STATUS_CODES: Final = {"succeeded": 1, "failed": 2, "expired": 3}
UNSUPPORTED = "unsupported_output"
_FILL_BLOCK = 1 << 16


def status_path(output: Path) -> Path:
    """``scores.npy`` -> ``scores.status.npy``."""
    return output.with_name(f"{output.stem}.status.npy")


class NpySink(SinkBase):
    def __init__(self, spec: JobSpec, start: Position, total: int,
                 errors: Path | None = None) -> None:
        super().__init__(spec, start, errors)
        self._path, self._total = spec.output, total
        self._path.parent.mkdir(parents=True, exist_ok=True)
        status = status_path(spec.output)
        resuming = start.rows > 0 and status.exists()
        self._status: Any = (open_memmap(status, mode="r+") if resuming else
                             open_memmap(status, mode="w+", dtype=np.uint8, shape=(total,)))
        self._out: Any = None
        if resuming and self._path.exists():
            try:
                self._out = open_memmap(self._path, mode="r+")
            except (ValueError, OSError) as exc:
                if (self._status[:start.rows] == 1).any():
                    raise BulkError(f"{self._path} is unreadable: {exc}") from exc
                # created after the checkpoint and cut short by the crash: create it again

    def _create(self, first: np.ndarray[Any, Any]) -> Any:
        out = open_memmap(self._path, mode="w+", dtype=first.dtype,
                          shape=(self._total, *first.shape))
        if out.dtype.kind == "f":
            for lo in range(0, self._total, _FILL_BLOCK):
                out[lo:lo + _FILL_BLOCK] = np.nan
        return out

    def _store(self, row: Row, result: Result, error: ErrorInfo | None) -> ErrorInfo | None:
        if error is None:
            error = self._put(row.index, result.outputs)
            self._status[row.index] = 1 if error is None else 2
        else:
            self._status[row.index] = STATUS_CODES.get(result.status, 2)
        return error

    def _put(self, index: int, outputs: Any) -> ErrorInfo | None:
        if isinstance(outputs, dict) or outputs is None:
            return ErrorInfo(UNSUPPORTED, ".npy output holds one tensor per row; the model "
                             "returned named tensors (use JSONL for those)")
        value = np.asarray(outputs)
        if self._out is None:
            self._out = self._create(value)
        if value.shape != self._out.shape[1:]:
            return ErrorInfo(UNSUPPORTED, f"output shape {list(value.shape)} differs from the "
                             f"first row's {list(self._out.shape[1:])}")
        self._out[index] = value
        return None

    def _sync_outputs(self) -> None:
        for array in (self._out, self._status):
            if array is not None:
                array.flush()

    def close(self) -> None:
        self._out = self._status = None  # unmaps (numpy closes the map with the array)
        super().close()
