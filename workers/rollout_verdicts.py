"""The rollout guard's tests: pure functions over fleet-merged counts, no I/O.

An automatic rollback that fires on noise teaches operators to turn it off, so every
verdict here needs both a *material* effect (the policy's threshold) and *significant*
evidence of it (a one-sided test at :data:`ALPHA`), never one batch or one request:

* **errors**: a pooled two-proportion z-test, canary's rate above stable's; the
  observed excess must also pass ``error_points``;
* **latency**: the canary's p99 compute must pass ``p99_ratio`` times stable's, and the
  share of canary batches slower than that bar must be significantly above stable's
  share (the same z-test), over at least :data:`MIN_BATCHES` batches of each and
  ``min_window`` canary requests, at :data:`CONSECUTIVE` evaluations in a row that saw
  new canary batches (:class:`Streak`);
* **outputs** (:mod:`batchfleet.workers.rollout_evidence`): PSI past ``psi`` once the
  source computed it (it is None below its minimum counts), and the share of requests
  with a NaN output by the same z-test past ``nan_points`` over at least
  :data:`MIN_ROWS` requests each.

Latency samples are **batch** compute times (the histogram ``RoleStats`` keeps), not
per-request ones: the requests of one batch share its time, so counting each would
make one slow batch look like dozens of independent slow samples, the very noise the
guard must not act on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

from batchfleet.connectors.rollout_stats import Histogram, RoleStats, bound_of
from batchfleet.schemas.registry import GuardThresholds
from batchfleet.workers.rollout_evidence import OutputEvidence

#: One-sided significance level of every test: about one false alarm in a thousand
#: judgements of identical versions, and evidence this strong comes fast for a real
#: regression (a canary failing 20% beats it within about 100 requests).
ALPHA: Final = 0.001
#: The z a test statistic must pass (about 3.09).
Z_CRIT: Final = NormalDist().inv_cdf(1.0 - ALPHA)
#: Batches each version needs before latency is judged: a p99 of 20 batches is their
#: maximum (one slow batch), of 100 the second slowest, and the share test has power.
MIN_BATCHES: Final = 100
#: Evaluations in a row, each with new canary batches, that must find the excess.
CONSECUTIVE: Final = 2
#: Requests each version needs before their NaN rates are compared (below it a few NaN
#: are chance). Requests, not output values: a NaN usually poisons a whole row, so the
#: elements of one row are not independent samples.
MIN_ROWS: Final = 2000


def two_proportion_z(x1: int, n1: int, x2: int, n2: int) -> float:
    """Pooled z of ``x1/n1`` above ``x2/n2`` (0 when neither side varies or one is empty)."""
    if n1 <= 0 or n2 <= 0:
        return 0.0
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2))
    return 0.0 if se == 0.0 else (x1 / n1 - x2 / n2) / se


def one_proportion_z(x: int, n: int, p0: float) -> float:
    """z of ``x/n`` above ``p0`` (the error test when stable took no requests)."""
    if n <= 0 or not 0.0 < p0 < 1.0:
        return 0.0
    return (x / n - p0) / math.sqrt(p0 * (1.0 - p0) / n)


def _pct(x: int, n: int) -> str:
    return f"{x / n:.1%} ({x} of {n})" if n else "— (0 of 0)"


def error_verdict(g: GuardThresholds, stable: RoleStats, canary: RoleStats) -> str | None:
    """Why the canary's errors warrant a rollback, or None."""
    if canary.requests < g.min_window:
        return None
    points = (canary.error_rate - stable.error_rate) * 100.0
    if points <= g.error_points:
        return None
    if stable.requests:
        z = two_proportion_z(canary.errors, canary.requests, stable.errors, stable.requests)
        test = "two-proportion z"
    else:  # a canary at 100%: judged against the threshold itself
        z = one_proportion_z(canary.errors, canary.requests, g.error_points / 100.0)
        test = f"one-proportion z against {g.error_points:g}%"
    if z <= Z_CRIT:
        return None
    return (f"canary error rate {_pct(canary.errors, canary.requests)} vs stable "
            f"{_pct(stable.errors, stable.requests)} requests: excess {points:.1f} > "
            f"{g.error_points:g} points, {test} = {z:.2f} > {Z_CRIT:.2f} "
            f"(one-sided alpha {ALPHA:g})")


def slower_than(hist: Histogram, bar_ms: float) -> int:
    """Batches in buckets whose upper bound is above ``bar_ms`` (exact to a bucket)."""
    return sum(n for b, n in hist.counts.items() if bound_of(b) > bar_ms)


def latency_judgeable(g: GuardThresholds, stable: RoleStats, canary: RoleStats) -> bool:
    """Both versions have the batches, and the canary the requests, latency needs."""
    return (min(stable.latency.total, canary.latency.total) >= MIN_BATCHES
            and canary.requests >= g.min_window)


def latency_excess(g: GuardThresholds, stable: RoleStats, canary: RoleStats) -> str | None:
    """At one evaluation: why the canary's p99 compute is significantly past the ratio,
    or None (not enough batches or requests, too small an excess, or not significant)."""
    if not latency_judgeable(g, stable, canary):
        return None
    sl, cl = stable.latency, canary.latency
    ns, nc = sl.total, cl.total
    s99, c99 = sl.percentile(0.99), cl.percentile(0.99)
    if s99 is None or c99 is None or not c99 > g.p99_ratio * s99:
        return None
    bar = g.p99_ratio * s99
    xc, xs = slower_than(cl, bar), slower_than(sl, bar)
    z = two_proportion_z(xc, nc, xs, ns)
    if z <= Z_CRIT:
        return None
    return (f"canary p99 compute {c99:g} ms vs stable {s99:g} ms ({c99 / s99:.1f}x > "
            f"{g.p99_ratio:g}x) over {nc} canary batches ({canary.requests} requests) and "
            f"{ns} stable batches ({stable.requests} requests): batches slower than "
            f"{bar:g} ms {_pct(xc, nc)} vs {_pct(xs, ns)}, two-proportion z = {z:.2f} > "
            f"{Z_CRIT:.2f} (one-sided alpha {ALPHA:g})")


@dataclass(slots=True)
class Streak:
    """The latency excess must hold at :data:`CONSECUTIVE` evaluations in a row, each on
    new canary batches (two reads of the same flush are one piece of evidence)."""

    held: int = 0
    seen_batches: int = -1

    def observe(self, canary_batches: int, excess: str | None) -> str | None:
        """Feed one evaluation; the reason once the excess has held long enough."""
        if excess is None:
            self.held = 0
            return None
        if canary_batches > self.seen_batches:
            self.held += 1
            self.seen_batches = canary_batches
        if self.held < CONSECUTIVE:
            return None
        return f"{excess}, at {self.held} consecutive evaluations"


def nan_verdict(points: float, stable: OutputEvidence, canary: OutputEvidence) -> str | None:
    """Why the canary's share of requests with a NaN output is too far above stable's, or
    None. Requests are the samples (the z-test assumes independent ones); the element
    NaN rates are named for context only."""
    if min(stable.rows, canary.rows) < MIN_ROWS:
        return None
    rc, rs = canary.nan_rows / canary.rows, stable.nan_rows / stable.rows
    if (rc - rs) * 100.0 <= points:
        return None
    z = two_proportion_z(canary.nan_rows, canary.rows, stable.nan_rows, stable.rows)
    if z <= Z_CRIT:
        return None
    return (f"canary NaN rate {_pct(canary.nan_rows, canary.rows)} vs stable "
            f"{_pct(stable.nan_rows, stable.rows)} requests with a NaN output (output "
            f"values {_pct(canary.nan_count, canary.count)} vs "
            f"{_pct(stable.nan_count, stable.count)}): excess {(rc - rs) * 100.0:.1f} > "
            f"{points:g} points, two-proportion z = {z:.2f} > {Z_CRIT:.2f} "
            f"(one-sided alpha {ALPHA:g})")


def psi_verdict(threshold: float, stable: OutputEvidence, canary: OutputEvidence
                ) -> str | None:
    """Why the canary's outputs drifted too far from stable's on the same traffic, or None
    (the source leaves ``psi`` None below its minimum counts)."""
    if canary.psi is None or not canary.psi > threshold:
        return None
    return (f"canary output PSI {canary.psi:.3f} > {threshold:g} against stable over "
            f"{canary.count} canary and {stable.count} stable output values")


def output_verdict(g: GuardThresholds, evidence: tuple[OutputEvidence, OutputEvidence] | None
                   ) -> str | None:
    """The output checks the policy sets, over ``(canary, stable)`` evidence."""
    if evidence is None:
        return None
    canary, stable = evidence
    if g.nan_points is not None and (why := nan_verdict(g.nan_points, stable, canary)):
        return why
    if g.psi is not None:
        return psi_verdict(g.psi, stable, canary)
    return None
