"""``bench --degrade``'s scenario, small: a model failing every request answers nobody
without a fallback chain, and everybody with one."""

from __future__ import annotations

import pytest

from batchfleet.bench.degrade import render, run_degrade

pytestmark = pytest.mark.e2e


def test_the_degrade_scenario_answers_everyone_only_with_a_fallback(redis_url: str) -> None:
    found = run_degrade(redis_url, rps=20.0, seconds=1.0, drain_s=3.0)
    without, with_chain = found["without_fallback"], found["with_fallback"]
    assert with_chain["arrivals"] > 0 and with_chain["share_answered"] == 1.0
    assert with_chain["statuses"] == {"succeeded": with_chain["arrivals"]}
    assert without["share_answered"] == 0.0  # failed or still waiting: never succeeded
    assert "| with `--fallback rules:…` | 100.0% |" in render(found)
