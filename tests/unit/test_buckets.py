"""Bucketed batch shapes: every batch pads to a warmed bucket, and padding never leaks out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from batchfleet.workers.models.buckets import bucket_for, bucket_sizes, pad_rows, unpad_rows

pytestmark = pytest.mark.unit


def test_buckets_are_powers_of_two_up_to_the_cap() -> None:
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(32) == (1, 2, 4, 8, 16, 32)
    assert bucket_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    assert [bucket_for(n, 48) for n in (1, 2, 3, 5, 17, 33, 48)] == [1, 2, 4, 8, 32, 48, 48]


@given(max_batch=st.integers(1, 512), data=st.data())
def test_every_batch_lands_in_a_warmed_bucket(max_batch: int, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, max_batch))
    bucket = bucket_for(rows, max_batch)
    assert bucket in bucket_sizes(max_batch)
    assert rows <= bucket <= max_batch
    assert bucket < 2 * rows or bucket == 1  # never more than double the work


@given(rows=st.integers(1, 40), extra=st.integers(0, 40), width=st.integers(1, 5),
       as_tensor=st.booleans())
def test_pad_then_unpad_returns_exactly_the_real_rows(rows: int, extra: int, width: int,
                                                      as_tensor: bool) -> None:
    batch_np = np.arange(rows * width, dtype=np.int64).reshape(rows, width)
    batch = torch.from_numpy(batch_np) if as_tensor else batch_np
    padded = pad_rows(batch, rows + extra)
    assert padded.shape == (rows + extra, width)
    # padding repeats the last real row: always input the model accepts
    assert (np.asarray(padded[rows:]) == batch_np[-1]).all()
    # a row-wise "model": each output row depends on its own input row only
    outputs = padded * 2
    back = unpad_rows(outputs, rows)
    np.testing.assert_array_equal(np.asarray(back), batch_np * 2)


def test_unpad_refuses_a_short_output() -> None:
    with pytest.raises(ValueError, match="returned 2 rows"):
        unpad_rows(np.zeros((2, 1)), 3)
