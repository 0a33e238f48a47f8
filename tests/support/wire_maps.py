"""Hypothesis helpers for decoder equivalence tests: maps whose fields are usual, absent
or odd, packed, and sometimes damaged (truncated, or one byte overwritten)."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import strategies as st

ABSENT = object()


def packed_map(draw: st.DrawFn, usual: dict[str, st.SearchStrategy[Any]],
               odd_values: st.SearchStrategy[Any], **fixed: Any) -> bytes:
    """A map of ``usual`` fields, one or two of them sometimes absent or odd, plus
    ``fixed`` ones, packed; one in eight truncated or with a byte overwritten."""
    odd = draw(st.sets(st.sampled_from(sorted(usual)), max_size=2)) if draw(
        st.integers(0, 2)) == 0 else set()
    body = {key: draw(st.one_of(st.just(ABSENT), odd_values) if key in odd else strategy)
            for key, strategy in usual.items()}
    body.update(fixed)
    raw: bytes = msgpack.packb({k: v for k, v in body.items() if v is not ABSENT},
                               use_bin_type=True)
    damage = draw(st.integers(0, 15))
    if damage == 0:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif damage == 1:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    return raw
