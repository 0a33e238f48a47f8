"""The fingerprint a caller-chosen request ID is checked against (issue 25 #9): the same
request in any of the forms the SDK accepts matches; another model or other inputs do not."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.producers.sending import inputs_fingerprint

pytestmark = pytest.mark.unit


def test_the_same_inputs_in_any_accepted_form_share_one_fingerprint() -> None:
    as_list = inputs_fingerprint("m", [0.5] * 10)  # sent as float32
    assert as_list == inputs_fingerprint("m", np.full(10, 0.5, np.float32))
    assert as_list == inputs_fingerprint("m", np.full(10, 0.5, ">f4"))  # byte order
    assert as_list == inputs_fingerprint("m", np.full((2, 10), 0.5, np.float32)[:, 0:10][0])


def test_another_model_dtype_shape_or_value_is_another_request() -> None:
    base = inputs_fingerprint("m", np.zeros(10, np.float32))
    others = [inputs_fingerprint("n", np.zeros(10, np.float32)),
              inputs_fingerprint("m", np.zeros(10, np.float64)),
              inputs_fingerprint("m", np.zeros((2, 5), np.float32)),
              inputs_fingerprint("m", np.eye(1, 10, dtype=np.float32)[0]),
              inputs_fingerprint("m", {"x": np.zeros(10, np.float32)})]
    assert base not in others and len(set(others)) == len(others)
    named = {"a": np.zeros(3, np.int64), "b": np.ones(2, np.float32)}
    assert inputs_fingerprint("m", named) == inputs_fingerprint("m", dict(named))
