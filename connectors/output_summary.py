"""What a model version answered (and was asked), summarised a whole batch at a time.

Pure code, shared by the worker (which summarises), the store (which merges) and the
readers (CLI, gateway, guard). Every number here merges by addition, so a minute's
window written by ten workers is exactly the sum of what each saw, and windows merge
into any longer period the same way.

* A **series** is one stream of float values: a small tensor pools all its elements
  (``float32[1]`` is its one value; ``float32[10]`` its ten), a large one (more than
  :data:`SMALL_ELEMENTS` elements per request) is summarised by two series, its L2 norm
  (``NAME:norm``) and its first :data:`HEAD_ELEMENTS` elements (``NAME:head``), so an
  embedding costs the same as a score.
* Each series keeps count, NaN and Inf counts, the sum and sum of squares of the finite
  values (mean and standard deviation), and a histogram over **fixed symmetric log
  buckets** (:func:`buckets_of`): :data:`SUB_BUCKETS` per octave of ``|x|``, linear
  within it (3.1% to 6.25% of the value wide), from :data:`TINY` up, mirrored for
  negative values, and one bucket for ``|x| < TINY``. The buckets never depend on the
  data, so any two windows merge; drift re-bins them into the reference's quantiles
  (``connectors.output_drift``).
* Classifier-like outputs (kind ``scores``: arg-max over the last axis; ``classes``:
  the integer values) also count each class.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from batchfleet.schemas.batch_decode import row_runs

#: Output kinds ``--output-kind`` accepts.
KINDS: Final = ("scores", "classes", "regression", "embedding")
#: A tensor with more elements per request than this is summarised (norm and head).
SMALL_ELEMENTS: Final = 32
#: How many leading elements of a large tensor are kept as its ``:head`` series.
HEAD_ELEMENTS: Final = 8
#: Columns per float32 dot product in :func:`row_norms` (the float64 sum is across them).
NORM_BLOCK: Final = 4096
#: Class IDs past this are counted as this one (a bounded number of hash fields).
MAX_CLASSES: Final = 1024
#: Buckets per octave of |x| (the float32's exponent and its top four mantissa bits).
SUB_BUCKETS: Final = 16
_SHIFT: Final = 23 - 4
#: |x| below this falls in the zero bucket.
TINY: Final = 1e-6
_M0: Final = int(np.array([TINY], dtype=np.float32).view(np.int32)[0]) >> _SHIFT
#: float32 exponent 255 (Inf and NaN) starts here.
_SPECIAL: Final = 0xFF << 4
#: Buckets are signed integers in -SPAN..SPAN, increasing with the value.
SPAN: Final = _SPECIAL - _M0

Array = np.ndarray[Any, Any]


def guess_kind(dtype: Any, shape: tuple[int, ...]) -> str:
    """The default output kind from a per-request output's dtype and shape: integers are
    ``classes``; one float ``regression``; a 1-D float vector of 2 to ``SMALL_ELEMENTS``
    elements ``scores`` (arg-max shares are counted); anything larger ``embedding``."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return "classes"
    size = math.prod(shape)
    if size <= 1:
        return "regression"
    if len(shape) == 1 and size <= SMALL_ELEMENTS:
        return "scores"
    return "embedding"


def buckets_of(values: Array) -> Array:
    """Each value's bucket (NaN and Inf must be removed first): 0 for ``|x| < TINY``,
    else ``sign(x) * (1 + index)``, monotone in ``x``. The index is read off the float32
    bits (exponent and top four mantissa bits): no logarithm, one shift per value."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.int32)
    m = np.maximum(((bits & 0x7FFFFFFF) >> _SHIFT) - (_M0 - 1), 0)
    signed: Array = np.where(bits < 0, -m, m)
    return signed


def bucket_value(b: int) -> float:
    """A representative value of bucket ``b`` (its middle)."""
    if b == 0:
        return 0.0
    bits = ((abs(b) + _M0 - 1) << _SHIFT) | (1 << (_SHIFT - 1))
    mag = float(np.array([bits], dtype=np.int32).view(np.float32)[0])
    return mag if b > 0 else -mag


@dataclass(slots=True)
class SeriesStats:
    """One series' counts; :meth:`merge` adds another's (any worker, any window)."""

    count: int = 0
    nan: int = 0
    inf: int = 0
    total: float = 0.0
    squares: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)
    classes: dict[int, int] = field(default_factory=dict)
    #: Per element of a multi-element tensor (a feature), over the rows of batches with no
    #: NaN or Inf: rows counted, then each element's sum and sum of squares (the pooled
    #: histogram dilutes one feature's shift among the others; these do not).
    col_rows: int = 0
    col_sums: list[float] = field(default_factory=list)
    col_squares: list[float] = field(default_factory=list)

    def merge(self, other: SeriesStats) -> None:
        self.count += other.count
        self.nan += other.nan
        self.inf += other.inf
        self.total += other.total
        self.squares += other.squares
        for b, n in other.buckets.items():
            self.buckets[b] = self.buckets.get(b, 0) + n
        for c, n in other.classes.items():
            self.classes[c] = self.classes.get(c, 0) + n
        if not other.col_rows:
            return
        if not self.col_rows:
            self.col_rows = other.col_rows
            self.col_sums, self.col_squares = list(other.col_sums), list(other.col_squares)
        elif len(self.col_sums) == len(other.col_sums):
            self.col_rows += other.col_rows
            self.col_sums = [a + b for a, b in zip(self.col_sums, other.col_sums, strict=True)]
            self.col_squares = [a + b for a, b in zip(self.col_squares, other.col_squares,
                                                      strict=True)]

    def column_moments(self) -> list[tuple[float, float]]:
        """Each element's (mean, standard deviation); empty when not kept."""
        n = self.col_rows
        if not n:
            return []
        out = []
        for total, squares in zip(self.col_sums, self.col_squares, strict=True):
            mean = total / n
            out.append((mean, math.sqrt(max(squares / n - mean * mean, 0.0))))
        return out

    @property
    def finite(self) -> int:
        return self.count - self.nan - self.inf

    @property
    def nan_rate(self) -> float | None:
        return self.nan / self.count if self.count else None

    @property
    def mean(self) -> float | None:
        return self.total / self.finite if self.finite else None

    @property
    def std(self) -> float | None:
        n = self.finite
        if not n:
            return None
        mean = self.total / n
        return math.sqrt(max(self.squares / n - mean * mean, 0.0))

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q <= 1) of the finite values, to a bucket."""
        n = sum(self.buckets.values())
        if not n:
            return None
        rank, seen = max(1, math.ceil(q * n)), 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                return bucket_value(b)
        return bucket_value(max(self.buckets))


def summarise(values: Array, classes: Array | None = None) -> SeriesStats:
    """One batch of one series (any shape; every element counts), vectorised: a few numpy
    passes over float32 whatever the batch size (wider floats are read as float32, so a
    value past 3.4e38 counts as Inf). ``classes``: class IDs to count (one per request)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
    nan = inf = 0
    finite = flat
    if flat.size and int(((flat.view(np.int32) & 0x7FFFFFFF) >> _SHIFT).max()) >= _SPECIAL:
        nan_mask, inf_mask = np.isnan(flat), np.isinf(flat)
        nan, inf = int(nan_mask.sum()), int(inf_mask.sum())
        finite = flat[~(nan_mask | inf_mask)]
    counts = np.bincount(buckets_of(finite) + SPAN)
    hit = np.flatnonzero(counts)
    out = SeriesStats(count=int(flat.size), nan=nan, inf=inf,
                      total=float(finite.sum(dtype=np.float64)),
                      squares=float(np.dot(finite, finite)),
                      buckets=dict(zip((hit - SPAN).tolist(), counts[hit].tolist(),
                                       strict=True)))
    if classes is not None and classes.size:
        ids = np.clip(np.asarray(classes, dtype=np.int64).ravel(), 0, MAX_CLASSES)
        per = np.bincount(ids)
        got = np.flatnonzero(per)
        out.classes = dict(zip(got.tolist(), per[got].tolist(), strict=True))
    return out


def series_of(name: str, rows: Array, kind: str | None) -> dict[str, SeriesStats]:
    """A batch of one tensor (``rows``: the requests stacked on axis 0) as its series;
    ``kind`` None for inputs (no class shares)."""
    n = rows.shape[0] if rows.ndim else 1
    per = rows.reshape(n, -1) if rows.ndim else rows.reshape(1, 1)
    classes: Array | None = None
    if kind == "scores" and per.shape[1] > 1:
        filled = np.nan_to_num(per, nan=-np.inf)
        classes = np.argmax(filled, axis=1)
    elif kind == "classes" and np.dtype(per.dtype).kind in "iub":
        classes = per[:, 0]
    base = name or "output"
    if per.shape[1] <= SMALL_ELEMENTS:
        out = summarise(per, classes)
        if per.shape[1] > 1 and out.nan == out.inf == 0:
            wide = per.astype(np.float64, copy=False)
            out.col_rows = n
            out.col_sums = wide.sum(axis=0).tolist()
            out.col_squares = np.einsum("ij,ij->j", wide, wide).tolist()
        return {base: out}
    return {f"{base}:norm": summarise(row_norms(per), classes),
            f"{base}:head": summarise(per[:, :HEAD_ELEMENTS])}


def row_norms(per: Array) -> Array:
    """Each row's L2 norm, in float64, without a float64 copy of the rows (an image's
    would be 1.2 MB per request): float32 dot products over :data:`NORM_BLOCK` columns
    at a time, added in float64 (relative error about 1e-7 against a float64 norm)."""
    acc = np.zeros(per.shape[0], dtype=np.float64)
    floats = per if per.dtype in (np.float32, np.float64) else per.astype(np.float32)
    for a in range(0, per.shape[1], NORM_BLOCK):
        block = floats[:, a:a + NORM_BLOCK]
        acc += np.einsum("ij,ij->i", block, block)
    out: Array = np.sqrt(acc)
    return out


@dataclass(slots=True)
class Summary:
    """One side (outputs or inputs) of one version: its series, and the requests counted."""

    rows: int = 0
    series: dict[str, SeriesStats] = field(default_factory=dict)
    #: Requests with a NaN anywhere in this side's tensors. A NaN usually poisons a whole
    #: row, so the guard tests this (requests are independent samples; a row's elements
    #: are not); the series' element counts stay for display.
    nan_rows: int = 0

    def merge(self, other: Summary) -> None:
        self.rows += other.rows
        self.nan_rows += other.nan_rows
        for name, stats in other.series.items():
            self.series.setdefault(name, SeriesStats()).merge(stats)

    def add(self, rows: int, series: Mapping[str, SeriesStats]) -> None:
        self.rows += rows
        for name, stats in series.items():
            self.series.setdefault(name, SeriesStats()).merge(stats)

    @property
    def empty(self) -> bool:
        return self.rows == 0

    def primary(self) -> tuple[str, SeriesStats] | None:
        """The series the one-line view shows: the first by name (a single tensor's only
        one; a large one's ``:head`` sorts before ``:norm``, so prefer ``:norm``)."""
        if not self.series:
            return None
        names = sorted(self.series, key=lambda s: (s.endswith(":head"), s))
        return names[0], self.series[names[0]]


def stacked(arrays: list[Any]) -> Array:
    """The requests' arrays stacked on axis 0: decoded inputs are rows of a few blocks
    already (``schemas.batch_decode.row_runs``), so those are joined without a copy per
    row; anything else is one ``np.stack``."""
    runs = row_runs(arrays)
    if runs is not None:
        return runs[0] if len(runs) == 1 else np.concatenate(runs)
    first = arrays[0]
    shape = getattr(first, "shape", None)
    if isinstance(first, np.ndarray) and first.ndim and all(
            getattr(a, "shape", None) == shape for a in arrays):
        try:  # one copy, no per-row expand_dims: same-shaped rows end to end
            joined = np.concatenate(arrays)
        except (ValueError, TypeError):
            joined = None
        if joined is not None and joined.shape[1:] == first.shape[1:] and (
                joined.shape[0] == first.shape[0] * len(arrays)):
            return joined.reshape(len(arrays), *first.shape)
    return np.stack([np.asarray(a) for a in arrays])


def summarise_batch(tensors: list[Any], kind: str | None) -> Summary:
    """The requests of one batch (each one's tensors: an array or a dict of arrays) as a
    :class:`Summary`: one stack per tensor, then :func:`series_of`."""
    out = Summary(rows=len(tensors))
    if not tensors:
        return out
    first = tensors[0]
    named = ([(name, stacked([t[name] for t in tensors])) for name in sorted(first)]
             if isinstance(first, dict) else [("", stacked(tensors))])
    nan_rows: Array | None = None
    for name, rows in named:
        series = series_of(name, rows, kind)
        out.series.update(series)
        if any(st.nan for st in series.values()):  # only then: one more pass
            hit: Array = np.asarray(np.isnan(rows.reshape(len(tensors), -1)).any(axis=1))
            nan_rows = hit if nan_rows is None else nan_rows | hit
    out.nan_rows = 0 if nan_rows is None else int(nan_rows.sum())
    return out


# --- the wire form: flat hash fields ----------------------------------------------------


def to_fields(summary: Summary) -> tuple[dict[str, int], dict[str, float]]:
    """(integer fields, float fields) to add into a stored hash: ``rows``, ``nan_rows``
    (only when some; older readers ignore it), then per
    series ``{s}|n``, ``|nan``, ``|inf``, ``|b{bucket}``, ``|k{class}``, ``|sum``, ``|sq``,
    and for a multi-element tensor ``|cn`` (rows) and each element's ``|c{i}`` (sum) and
    ``|d{i}`` (sum of squares). Windows merge by adding fields, so a window's columns
    are only meaningful while every worker sends the same number of elements."""
    ints: dict[str, int] = {"rows": summary.rows}
    if summary.nan_rows:
        ints["nan_rows"] = summary.nan_rows
    floats: dict[str, float] = {}
    for s, st in summary.series.items():
        ints[f"{s}|n"] = st.count
        if st.nan:
            ints[f"{s}|nan"] = st.nan
        if st.inf:
            ints[f"{s}|inf"] = st.inf
        for b, n in st.buckets.items():
            ints[f"{s}|b{b}"] = n
        for c, n in st.classes.items():
            ints[f"{s}|k{c}"] = n
        floats[f"{s}|sum"] = st.total
        floats[f"{s}|sq"] = st.squares
        if st.col_rows:
            ints[f"{s}|cn"] = st.col_rows
            for i, (total, squares) in enumerate(zip(st.col_sums, st.col_squares,
                                                     strict=True)):
                floats[f"{s}|c{i}"] = total
                floats[f"{s}|d{i}"] = squares
    return ints, floats


def from_fields(raw: Mapping[Any, Any]) -> Summary:
    """The inverse of :func:`to_fields` (fields it does not know are ignored)."""
    out = Summary()
    cols: defaultdict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for key, value in raw.items():
        k = key.decode() if isinstance(key, bytes) else str(key)
        v = value.decode() if isinstance(value, bytes) else str(value)
        if k == "rows":
            out.rows = int(v)
            continue
        if k == "nan_rows":
            out.nan_rows = int(v)
            continue
        s, sep, what = k.rpartition("|")
        if not sep:
            continue
        st = out.series.setdefault(s, SeriesStats())
        if what == "n":
            st.count = int(v)
        elif what == "nan":
            st.nan = int(v)
        elif what == "inf":
            st.inf = int(v)
        elif what == "sum":
            st.total = float(v)
        elif what == "sq":
            st.squares = float(v)
        elif what[:1] == "b" and _is_int(what[1:]):
            st.buckets[int(what[1:])] = int(v)
        elif what[:1] == "k" and what[1:].isdigit():
            st.classes[int(what[1:])] = int(v)
        elif what == "cn":
            st.col_rows = int(v)
        elif what[:1] in ("c", "d") and what[1:].isdigit():
            cols[(s, what[0])][int(what[1:])] = float(v)
    for (s, which), values in cols.items():
        st = out.series[s]
        got = [values.get(i, 0.0) for i in range(max(values) + 1)]
        if which == "c":
            st.col_sums = got
        else:
            st.col_squares = got
    for st in out.series.values():  # a partial record (never written so) keeps no columns
        if len(st.col_sums) != len(st.col_squares):
            st.col_rows, st.col_sums, st.col_squares = 0, [], []
    return out


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
