"""Bucketed batch shapes for compiled and exported models: pure functions.

A compiled graph or an ONNX Runtime session runs fastest on shapes it has seen.
Padding every batch up to the next power of two (capped at ``max_batch_size``)
bounds the shapes to ``log2(max_batch_size) + 1`` buckets, each warmed once at
start-up, so no request pays a recompile. Padding rows repeat the last real row
(always valid input, e.g. token IDs inside the vocabulary) and are cut off
before anything is split into results.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Every bucket a batch of at most ``max_batch_size`` rows can land in, ascending."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    sizes: list[int] = []
    size = 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch_size)
    return tuple(sizes)


def bucket_for(rows: int, max_batch_size: int) -> int:
    """The smallest bucket holding ``rows``: the next power of two, or ``max_batch_size``.

    A batch larger than ``max_batch_size`` (a caller that ignores the batcher) is its
    own bucket rather than an error: it is padded by nothing.
    """
    if rows < 1:
        raise ValueError("a batch has at least one row")
    if rows >= max_batch_size:
        return rows
    return min(1 << (rows - 1).bit_length(), max_batch_size)


def pad_rows(batch: ArrayT, size: int) -> ArrayT:
    """``batch`` grown to ``size`` rows by repeating its last row (no copy when it fits)."""
    rows = batch.shape[0]
    if rows >= size:
        return batch
    if isinstance(batch, torch.Tensor):
        filler_t = batch[-1:].expand(size - rows, *batch.shape[1:])
        return torch.cat([batch, filler_t])
    filler = np.broadcast_to(batch[-1:], (size - rows, *batch.shape[1:]))
    return np.concatenate([batch, filler])


def unpad_rows(outputs: ArrayT, rows: int) -> ArrayT:
    """The first ``rows`` outputs: padding rows are never returned."""
    if outputs.shape[0] < rows:
        raise ValueError(f"model returned {outputs.shape[0]} rows for a padded batch of {rows}")
    return outputs[:rows]
