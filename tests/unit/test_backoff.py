from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchfleet.workers.backoff import compute_backoff

pytestmark = pytest.mark.unit


@given(st.integers(1, 200), st.floats(0.0, 1.0, exclude_max=True))
def test_full_jitter_stays_within_the_capped_exponential(attempt: int, draw: float) -> None:
    delay = compute_backoff(attempt, base_s=0.1, cap_s=30.0, rand=lambda: draw)
    assert 0.0 <= delay <= min(30.0, 0.1 * 2 ** (attempt - 1))


def test_ceiling_doubles_until_the_cap() -> None:
    top = [compute_backoff(n, base_s=1.0, cap_s=10.0, rand=lambda: 1.0) for n in range(1, 7)]
    assert top == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_attempts_are_one_based() -> None:
    with pytest.raises(ValueError):
        compute_backoff(0)
