"""Rules fallbacks for tests: ``rules:tests.support.fallback_rules:score``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def score(inputs: Sequence[Any]) -> np.ndarray:
    """A rules score over the whole batch: the mean of each row's features, as float32[1]."""
    rows = np.stack([np.asarray(x, np.float32) for x in inputs])
    return rows.mean(axis=1, keepdims=True).astype(np.float32)


def broken(inputs: Sequence[Any]) -> np.ndarray:
    raise RuntimeError("the rules service is down too")
