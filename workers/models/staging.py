"""Host staging buffers for collating a batch, pinned when the model runs on CUDA.

Pinned (page-locked) memory is what makes ``tensor.to(cuda, non_blocking=True)``
asynchronous. Two buffers per shape are used in turn (double buffering) so a
batch being stacked never overwrites one whose copy may still be in flight.
On CPU the stack goes straight into a fresh tensor: there is nothing to pin.

A batch whose requests were decoded together is already one array, or a few
(``schemas.batch_decode``): it is copied in runs of rows instead of row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from batchfleet.schemas.batch_decode import row_runs
from batchfleet.schemas.tensors import Array


class PinnedStaging:
    def __init__(self, max_batch_size: int, enabled: bool = False) -> None:
        self.max_batch_size = max_batch_size
        self.enabled = enabled
        self._buffers: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._turn: dict[tuple[Any, ...], int] = {}

    def stack(self, arrays: Sequence[Array]) -> torch.Tensor:
        """Stack per-request arrays into one batch tensor (one copy, always a fresh one:
        a model that writes to its input must not change the requests' own arrays)."""
        n = len(arrays)
        runs = row_runs(arrays)
        if not self.enabled or n > self.max_batch_size:
            return torch.from_numpy(np.stack(arrays) if runs is None else np.concatenate(runs))
        first = arrays[0]
        key = (first.dtype.str, first.shape)
        pair = self._buffers.get(key)
        if pair is None:
            dtype = torch.from_numpy(np.empty(0, dtype=first.dtype)).dtype
            pair = [
                torch.empty((self.max_batch_size, *first.shape), dtype=dtype, pin_memory=True)
                for _ in range(2)
            ]
            self._buffers[key] = pair
        turn = self._turn.get(key, 0)
        self._turn[key] = 1 - turn
        buf = pair[turn][:n]
        if runs is None:
            np.stack(arrays, out=buf.numpy())
        else:
            np.concatenate(runs, out=buf.numpy())
        return buf
