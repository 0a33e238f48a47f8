"""Drift scores between a version's statistics and a reference (pure functions).

Each score is computed only once both sides hold at least :data:`MIN_COUNT` values
(None below it), because small samples look different by chance alone: PSI over B bins
of two samples of the *same* distribution is about ``(B - 1) * (1/N1 + 1/N2)`` (a
chi-square's expectation), so 20 bins at 2,000 values a side read about 0.019 on
identical traffic, well under the 0.1 we call "moderate".

* **PSI** (population stability index) over :data:`PSI_BINS` bins cut at the
  reference's quantiles (from its fine buckets; ``connectors.output_summary``):
  ``sum((p - q) * ln(p / q))``, shares floored at :data:`PSI_FLOOR`.
* **KS**: the largest gap between the two empirical CDFs, over the fine buckets.
* **NaN-rate change**: this version's NaN share minus the reference's (signed).
* **class-share change**: total variation distance of the arg-max class shares,
  ``0.5 * sum |p_c - q_c|`` (the share of answers that moved class).
* **mean shift** (multi-element tensors: features): the largest move of one element's
  mean, in the reference's standard deviations, ``max_i |m_i - r_i| / s_i``, once both
  sides hold :data:`MIN_COUNT` rows. The pooled histogram dilutes one feature's shift
  among the others (one of ten features moved by one standard deviation reads a PSI of
  about 0.01); this does not.
"""

from __future__ import annotations

import math
from typing import Final

from batchfleet.connectors.output_summary import SeriesStats, Summary

#: Values both sides must hold before any score is computed.
MIN_COUNT: Final = 2000
#: PSI bins (cut at the reference's quantiles).
PSI_BINS: Final = 20
#: A bin's share never reads below this (an empty bin would make PSI infinite).
PSI_FLOOR: Final = 1e-4
#: The stats a drift report carries (the ``stat`` label of ``batchfleet_output_drift``).
STATS: Final = ("psi", "ks", "nan_rate_change", "class_share_change", "mean_shift")


def psi_bias(bins: int, n1: int, n2: int) -> float:
    """PSI's expected value on two samples of one distribution (its noise floor)."""
    return (bins - 1) * (1 / n1 + 1 / n2)


def cuts(reference: dict[int, int], bins: int = PSI_BINS) -> list[int]:
    """Bucket upper edges (inclusive) splitting the reference into ``bins`` equal shares,
    to a bucket; fewer when its values sit in fewer buckets."""
    n = sum(reference.values())
    out: list[int] = []
    seen, k = 0, 1
    for b in sorted(reference)[:-1]:  # the largest bucket is the last bin's top
        seen += reference[b]
        while k < bins and seen >= k * n / bins:
            if not out or out[-1] != b:
                out.append(b)
            k += 1
    return out


def binned(buckets: dict[int, int], edges: list[int]) -> list[int]:
    """Bucket counts summed into the bins ``edges`` cut (the last bin is open above)."""
    out = [0] * (len(edges) + 1)
    for b, n in buckets.items():
        lo, hi = 0, len(edges)
        while lo < hi:  # the first edge >= b
            mid = (lo + hi) // 2
            if edges[mid] < b:
                lo = mid + 1
            else:
                hi = mid
        out[lo] += n
    return out


def psi(current: dict[int, int], reference: dict[int, int], bins: int = PSI_BINS) -> float:
    """PSI of ``current`` against ``reference`` (fine-bucket histograms)."""
    edges = cuts(reference, bins)
    a, e = binned(current, edges), binned(reference, edges)
    na, ne = sum(a), sum(e)
    if not na or not ne:
        return 0.0
    total = 0.0
    for x, y in zip(a, e, strict=True):
        p, q = max(x / na, PSI_FLOOR), max(y / ne, PSI_FLOOR)
        total += (p - q) * math.log(p / q)
    return total


def ks(current: dict[int, int], reference: dict[int, int]) -> float:
    """The Kolmogorov-Smirnov distance, to a bucket."""
    na, ne = sum(current.values()), sum(reference.values())
    if not na or not ne:
        return 0.0
    ca = ce = 0
    gap = 0.0
    for b in sorted(current.keys() | reference.keys()):
        ca += current.get(b, 0)
        ce += reference.get(b, 0)
        gap = max(gap, abs(ca / na - ce / ne))
    return gap


def class_share_change(current: dict[int, int], reference: dict[int, int]) -> float:
    na, ne = sum(current.values()), sum(reference.values())
    if not na or not ne:
        return 0.0
    return 0.5 * sum(abs(current.get(c, 0) / na - reference.get(c, 0) / ne)
                     for c in current.keys() | reference.keys())


def mean_shift(cur: SeriesStats, ref: SeriesStats, min_count: int = MIN_COUNT
               ) -> float | None:
    """The largest per-element mean move in reference standard deviations (None below
    ``min_count`` rows a side, or without per-element moments)."""
    if cur.col_rows < min_count or ref.col_rows < min_count:
        return None
    a, b = cur.column_moments(), ref.column_moments()
    if not a or len(a) != len(b):
        return None
    shifts = [abs(m - r) / sd for (m, _), (r, sd) in zip(a, b, strict=True) if sd > 0]
    return max(shifts) if shifts else None


def series_drift(cur: SeriesStats, ref: SeriesStats, min_count: int = MIN_COUNT,
                 bins: int = PSI_BINS) -> dict[str, float | None]:
    """Every score of one series (None where either side is under ``min_count``)."""
    enough = cur.count >= min_count and ref.count >= min_count
    hist = enough and sum(cur.buckets.values()) > 0 and sum(ref.buckets.values()) > 0
    classes = enough and bool(cur.classes) and bool(ref.classes)
    return {
        "psi": psi(cur.buckets, ref.buckets, bins) if hist else None,
        "ks": ks(cur.buckets, ref.buckets) if hist else None,
        "nan_rate_change": (cur.nan / cur.count - ref.nan / ref.count) if enough else None,
        "class_share_change": class_share_change(cur.classes, ref.classes)
        if classes else None,
        "mean_shift": mean_shift(cur, ref, min_count),
    }


def drift(current: Summary, reference: Summary | None, min_count: int = MIN_COUNT,
          bins: int = PSI_BINS) -> dict[str, float | None]:
    """A side's scores: the worst (largest) over the series both sides hold; for the
    NaN-rate change, the one of largest size. All None without a reference."""
    out: dict[str, float | None] = dict.fromkeys(STATS)
    if reference is None:
        return out
    for name, cur in current.series.items():
        ref = reference.series.get(name)
        if ref is None:
            continue
        for stat, value in series_drift(cur, ref, min_count, bins).items():
            held = out[stat]
            if value is not None and (held is None or abs(value) > abs(held)):
                out[stat] = value
    return out
