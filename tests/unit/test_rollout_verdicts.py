"""The guard's tests as pure functions (workers/rollout_verdicts.py): each verdict needs a
material effect AND significant evidence, over the documented minimum counts; latency
must hold at two consecutive evaluations on new batches; the output checks judge
hand-made ``OutputEvidence``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchfleet.connectors.rollout_stats import Histogram, RoleStats
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.workers.middleware.rollout_guard import guard_verdict
from batchfleet.workers.rollout_evidence import OutputEvidence
from batchfleet.workers.rollout_verdicts import (
    ALPHA,
    CONSECUTIVE,
    MIN_BATCHES,
    MIN_ROWS,
    Z_CRIT,
    Streak,
    error_verdict,
    latency_excess,
    nan_verdict,
    one_proportion_z,
    output_verdict,
    psi_verdict,
    slower_than,
    two_proportion_z,
)

pytestmark = pytest.mark.unit

G = GuardThresholds(error_points=5.0, p99_ratio=2.0, min_window=200)


def _role(requests: int, errors: int = 0, times_ms: list[float] | None = None) -> RoleStats:
    hist = Histogram()
    for ms in times_ms or []:
        hist.add(ms)
    return RoleStats(requests, errors, hist)


def test_z_statistics_match_the_textbook_values() -> None:
    assert round(Z_CRIT, 4) == 3.0902 and ALPHA == 0.001
    # 30/100 vs 10/100: pooled p 0.2, se sqrt(.2*.8*.02) = 0.0566, z = 3.54
    assert two_proportion_z(30, 100, 10, 100) == pytest.approx(0.2 / math.sqrt(0.0032))
    assert two_proportion_z(0, 100, 0, 100) == 0.0  # nothing varies: no evidence
    assert two_proportion_z(5, 0, 0, 10) == 0.0
    assert one_proportion_z(20, 100, 0.05) == pytest.approx(0.15 / math.sqrt(0.05 * 0.95 / 100))


def test_errors_need_the_window_the_effect_and_significance() -> None:
    assert error_verdict(G, _role(2000), _role(199, 100)) is None  # window not full
    why = error_verdict(G, _role(2000), _role(200, 42))
    assert why is not None and why.startswith("canary error rate 21.0% (42 of 200) vs stable "
                                              "0.0% (0 of 2000) requests: excess 21.0 > 5 "
                                              "points, two-proportion z = ")
    assert "(one-sided alpha 0.001)" in why
    assert error_verdict(G, _role(2000, 40), _role(500, 30)) is None  # 6% vs 2%: 4 points
    # 7% vs 1% over 200 and 300 requests: z = 3.6, significant; over 200 and 40 stable
    # requests z is 1.7: chance, not evidence.
    assert error_verdict(G, _role(300, 3), _role(200, 14)) is not None
    assert error_verdict(G, _role(40, 0), _role(200, 14)) is None
    # a canary at 100% (stable took nothing): judged against the threshold itself
    lone = error_verdict(G, _role(0), _role(400, 80))
    assert lone is not None and "one-proportion z against 5%" in lone
    assert error_verdict(G, _role(0), _role(400, 24)) is None  # 6%: not significantly > 5%


def test_an_identical_canary_is_never_rolled_back_for_errors_by_chance() -> None:
    """1,000 simulated judgements of two versions failing 2% each: no rollback at the
    default 5 points; at a 1-point threshold the false alarms stay about ALPHA."""
    rng = np.random.default_rng(7)
    hits = {5.0: 0, 1.0: 0}
    for _ in range(1000):
        s, c = rng.binomial(4000, 0.02), rng.binomial(1000, 0.02)
        for points in hits:
            hits[points] += error_verdict(GuardThresholds(error_points=points),
                                          _role(4000, int(s)), _role(1000, int(c))) is not None
    assert hits[5.0] == 0
    assert hits[1.0] <= 3  # 1 here: ALPHA x 1,000


def test_latency_needs_minimum_batches_and_requests() -> None:
    fast, slow = [1.0] * MIN_BATCHES, [5.0] * MIN_BATCHES
    assert latency_excess(G, _role(5000, times_ms=fast), _role(500, times_ms=slow)) is not None
    few = [5.0] * (MIN_BATCHES - 1)
    assert latency_excess(G, _role(5000, times_ms=fast), _role(500, times_ms=few)) is None
    assert latency_excess(G, _role(5000, times_ms=fast), _role(199, times_ms=slow)) is None
    assert latency_excess(G, _role(5000, times_ms=fast[1:]), _role(500, times_ms=slow)) is None


def test_a_few_slow_batches_are_not_a_slow_canary() -> None:
    """The issue's case: one slow batch decided the old rule (p99 of 20 batches). Here 3
    slow canary batches among 150 (2%) against 1 in 300 of stable's: p99 7.5x, but the
    share test says chance."""
    stable = [0.5] * 299 + [10.0]
    canary = [0.5] * 147 + [98.0] * 3
    s, c = _role(4000, times_ms=stable), _role(1000, times_ms=canary)
    c99, s99 = c.latency.percentile(0.99), s.latency.percentile(0.99)
    assert c99 is not None and s99 is not None and c99 > 2 * s99  # the old rule fired
    assert latency_excess(G, s, c) is None
    # the same slow batches both sides: noise hits both
    assert latency_excess(G, _role(4000, times_ms=[0.5] * 290 + [30.0] * 10),
                          _role(1000, times_ms=[0.5] * 145 + [30.0] * 5)) is None


def test_a_truly_slower_canary_fails_the_latency_test_with_its_numbers() -> None:
    rng = np.random.default_rng(1)
    stable = list(rng.normal(5.0, 0.3, 300))
    canary = list(rng.normal(15.0, 0.9, 150))
    why = latency_excess(G, _role(4000, times_ms=stable), _role(1000, times_ms=canary))
    assert why is not None and why.startswith("canary p99 compute ")
    for part in ("over 150 canary batches (1000 requests)", "300 stable batches (4000 "
                 "requests)", "two-proportion z = ", "> 2x"):
        assert part in why, why
    # 1.5x slower: below the ratio, whatever the evidence
    assert latency_excess(G, _role(4000, times_ms=stable),
                          _role(1000, times_ms=[x * 1.5 for x in stable[:150]])) is None


def test_slower_than_counts_by_bucket() -> None:
    h = Histogram()
    h.add(1.0, 5)
    h.add(100.0, 2)
    assert slower_than(h, 50.0) == 2 and slower_than(h, 0.5) == 7 and slower_than(h, 1e6) == 0


def test_the_latency_excess_must_hold_at_two_evaluations_on_new_batches() -> None:
    assert CONSECUTIVE == 2
    streak = Streak()
    assert streak.observe(120, "slow") is None
    assert streak.observe(120, "slow") is None  # the same flush read twice: no new evidence
    assert streak.observe(130, None) is None  # the excess did not hold: start again
    assert streak.observe(140, "slow") is None
    why = streak.observe(150, "slow")
    assert why == "slow, at 2 consecutive evaluations"


def test_guard_verdict_combines_errors_and_outputs_only_with_a_canary() -> None:
    policy = RolloutPolicy("v1", canary="v2", percent=20, guard=G)
    assert guard_verdict(policy, _role(2000), _role(500, 105)) is not None
    assert guard_verdict(RolloutPolicy("v1"), _role(10), _role(10_000, 9_000)) is None
    nan = (_ev(5000, 250), _ev(20_000, 0))
    assert guard_verdict(policy, _role(2000), _role(500), nan) is None  # no nan threshold
    with_nan = RolloutPolicy("v1", canary="v2", percent=20,
                             guard=GuardThresholds(nan_points=1.0))
    why = guard_verdict(with_nan, _role(2000), _role(500), nan)
    assert why is not None and why.startswith("canary NaN rate 5.0% (250 of 5000) vs stable "
                                              "0.0% (0 of 20000) requests with a NaN output")


def _ev(rows: int, nan_rows: int, per_row: int = 1) -> OutputEvidence:
    """Evidence of ``rows`` requests of ``per_row`` output values, ``nan_rows`` all NaN."""
    return OutputEvidence(rows * per_row, nan_rows * per_row, None, rows, nan_rows)


def test_nan_verdict_needs_counts_effect_and_significance() -> None:
    clean = _ev(20_000, 0)
    assert nan_verdict(1.0, clean, _ev(MIN_ROWS - 1, 200)) is None
    assert nan_verdict(1.0, clean, _ev(5000, 250)) is not None
    assert nan_verdict(1.0, _ev(20_000, 900), _ev(5000, 250)) is None  # 5% vs 4.5%: 0.5 points
    # 1.5 points over 2,000 vs 2,000 requests: 40 vs 10 NaN, z = 4.3: significant
    assert nan_verdict(1.0, _ev(2000, 10), _ev(2000, 40)) is not None
    # 6 vs 0 of 2,000: only 0.3 points (below the effect) and z = 2.45 (not significant)
    assert nan_verdict(1.0, _ev(2000, 0), _ev(2000, 6)) is None


def test_nan_verdict_counts_requests_not_the_elements_of_a_poisoned_row() -> None:
    """float32[10] outputs, NaN in whole rows: 8 of 2,000 requests against none is z = 2.83
    (not significant); counted as 80 of 20,000 values it read z = 8.95 and rolled back."""
    stable, canary = _ev(2000, 0, per_row=10), _ev(2000, 8, per_row=10)
    assert two_proportion_z(80, 20_000, 0, 20_000) > Z_CRIT  # the old, inflated test
    assert nan_verdict(0.2, stable, canary) is None
    # and the minimum is in requests: 300 requests of 10 values each are not judged
    assert nan_verdict(0.2, _ev(300, 0, per_row=10), _ev(300, 30, per_row=10)) is None


def test_psi_verdict_uses_the_sources_psi_once_it_has_one() -> None:
    stable = OutputEvidence(20_000, 0, None)
    assert psi_verdict(0.2, stable, OutputEvidence(500, 0, None)) is None  # below minimum
    assert psi_verdict(0.2, stable, OutputEvidence(5000, 0, 0.1)) is None
    why = psi_verdict(0.2, stable, OutputEvidence(5000, 0, 0.74))
    assert why == ("canary output PSI 0.740 > 0.2 against stable over 5000 canary and 20000 "
                   "stable output values")
    g = GuardThresholds(psi=0.2)
    assert output_verdict(g, None) is None
    assert output_verdict(g, (OutputEvidence(5000, 0, 0.74), stable)) == why
