"""The benchmark's edges: no negative worker overhead (issue 25, item 17), a sane plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from batchfleet.bench.plan import full_plan
from batchfleet.bench.report import _fmt
from batchfleet.bench.scenario import worker_overhead_us
from batchfleet.bench.targets import _num
from batchfleet.schemas.errors import ConfigError

pytestmark = pytest.mark.unit


def test_a_negative_overhead_is_no_measurement() -> None:
    # 0.5 s of worker CPU against 2 s of compute wall: the step was descheduled
    over = worker_overhead_us(0.5, 2.0, 1000, 1.2)
    assert over == {"as_specified": None, "cpu_corrected": None}
    assert _fmt(over["as_specified"]) == "-"
    assert _num(over["as_specified"]) != _num(over["as_specified"])  # NaN: target not met
    assert worker_overhead_us(3.0, 2.0, 1000, 1.2) == {"as_specified": 1000.0,
                                                      "cpu_corrected": 600.0}
    assert worker_overhead_us(1.0, 0.0, 0, 1.0)["as_specified"] is None


def test_a_bench_plan_needs_at_least_one_worker(tmp_path: Path) -> None:
    plan = replace(full_plan(tmp_path), workers=0)
    with pytest.raises(ConfigError, match="workers must be at least 1"):
        plan.validated()
    assert replace(plan, workers=3).validated().workers == 3
