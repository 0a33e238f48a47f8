"""Exponential backoff with full jitter, as a pure function.

Full jitter (a uniform draw between zero and the exponential cap) spreads
retries from many workers apart instead of having them stampede together.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def compute_backoff(
    attempt: int,
    *,
    base_s: float = 0.1,
    cap_s: float = 30.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): U(0, min(cap, base*2^(n-1)))."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    ceiling = min(cap_s, base_s * (2.0 ** min(attempt - 1, 62)))
    return rand() * ceiling
