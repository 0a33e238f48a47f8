"""The pure output statistics: batch summaries, their merge, their wire form, drift."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchfleet.connectors.output_drift import (
    MIN_COUNT,
    cuts,
    drift,
    ks,
    psi,
    psi_bias,
    series_drift,
)
from batchfleet.connectors.output_summary import (
    HEAD_ELEMENTS,
    SeriesStats,
    Summary,
    bucket_value,
    buckets_of,
    from_fields,
    guess_kind,
    row_norms,
    summarise,
    summarise_batch,
    to_fields,
)


def test_buckets_are_monotone_and_close_to_the_value() -> None:
    xs = np.array([-1e6, -3.0, -1.0, -0.001, -1e-9, 0.0, 1e-9, 0.001, 0.5, 1.0, 3.0, 1e6])
    b = buckets_of(xs)
    assert list(b) == sorted(b)
    assert b[4] == b[5] == b[6] == 0
    for x, bucket in zip(xs, b, strict=True):
        if abs(x) >= 1e-6:
            assert bucket_value(int(bucket)) == pytest.approx(x, rel=0.05)


def test_summarise_counts_nan_inf_and_moments() -> None:
    values = np.array([1.0, 2.0, 3.0, np.nan, np.inf, -np.inf])
    s = summarise(values)
    assert (s.count, s.nan, s.inf, s.finite) == (6, 1, 2, 3)
    assert s.mean == pytest.approx(2.0)
    assert s.std == pytest.approx(math.sqrt(2 / 3))
    assert s.nan_rate == pytest.approx(1 / 6)
    assert sum(s.buckets.values()) == 3


def test_merge_is_exactly_the_sum_of_the_parts() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=1000), rng.normal(size=700)
    whole, parts = summarise(np.concatenate([a, b])), summarise(a)
    parts.merge(summarise(b))
    assert (parts.count, parts.buckets) == (whole.count, whole.buckets)
    assert parts.total == pytest.approx(whole.total)
    assert parts.squares == pytest.approx(whole.squares)


def test_quantiles_read_to_a_bucket() -> None:
    s = summarise(np.random.default_rng(2).normal(5.0, 1.0, size=20_000))
    assert s.quantile(0.5) == pytest.approx(5.0, rel=0.05)
    assert s.quantile(0.99) == pytest.approx(5.0 + 2.326, rel=0.05)


def test_guessing_the_kind_from_the_output_spec() -> None:
    assert guess_kind("float32", (1,)) == "regression"
    assert guess_kind("float32", ()) == "regression"
    assert guess_kind("float32", (10,)) == "scores"
    assert guess_kind("int64", (1,)) == "classes"
    assert guess_kind("float32", (384,)) == "embedding"
    assert guess_kind("float32", (4, 4)) == "embedding"


def test_scores_count_arg_max_shares_and_large_outputs_are_summarised() -> None:
    rows = [np.array([0.1, 0.7, 0.2]), np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.2, 0.6])]
    s = summarise_batch(rows, "scores")
    assert s.series["output"].classes == {0: 1, 1: 1, 2: 1}
    assert s.series["output"].count == 9
    big = [np.full(100, 2.0, dtype=np.float32) for _ in range(4)]
    e = summarise_batch(big, "embedding")
    assert sorted(e.series) == ["output:head", "output:norm"]
    assert e.series["output:norm"].count == 4
    assert e.series["output:norm"].mean == pytest.approx(20.0)
    assert e.series["output:head"].count == 4 * HEAD_ELEMENTS
    named = summarise_batch([{"a": np.zeros(2), "b": np.ones(1)}] * 3, None)
    assert sorted(named.series) == ["a", "b"] and named.rows == 3


def test_the_wire_form_round_trips() -> None:
    s = summarise_batch([np.array([0.2, np.nan, 0.7]), np.array([0.9, 0.05, -3.0])], "scores")
    ints, floats = to_fields(s)
    raw = {k: str(v) for k, v in ints.items()} | {k: repr(v) for k, v in floats.items()}
    back = from_fields({k.encode(): v.encode() for k, v in raw.items()})
    assert back.rows == s.rows
    assert back.series.keys() == s.series.keys()
    for name, st in s.series.items():
        got = back.series[name]
        assert (got.count, got.nan, got.buckets, got.classes) == (
            st.count, st.nan, st.buckets, st.classes)
        assert got.total == pytest.approx(st.total)


def test_psi_and_ks_on_the_same_distribution_stay_near_the_noise_floor() -> None:
    rng = np.random.default_rng(3)
    a = summarise(rng.normal(size=20_000))
    b = summarise(rng.normal(size=20_000))
    assert psi(a.buckets, b.buckets) < 3 * psi_bias(20, 20_000, 20_000)
    assert ks(a.buckets, b.buckets) < 0.03


def test_a_shift_shows_in_psi_and_ks() -> None:
    rng = np.random.default_rng(4)
    ref = summarise(rng.normal(size=20_000))
    moved = summarise(rng.normal(1.0, 1.0, size=20_000))
    assert psi(moved.buckets, ref.buckets) > 0.5
    assert ks(moved.buckets, ref.buckets) > 0.3
    sig = rng.uniform(0.2, 0.6, size=20_000)  # a sigmoid-like score shifted by 0.3
    assert psi(summarise(sig + 0.3).buckets, summarise(sig).buckets) > 0.25


def test_cuts_split_the_reference_into_equal_shares() -> None:
    ref = summarise(np.random.default_rng(5).normal(size=50_000)).buckets
    edges = cuts(ref)
    assert len(edges) == 19
    # a discrete reference has fewer cuts, never a repeated one
    assert cuts({3: 100, 7: 100}) == [3]


def test_scores_need_the_minimum_count_on_both_sides() -> None:
    rng = np.random.default_rng(6)
    small, big = summarise(rng.normal(size=MIN_COUNT - 1)), summarise(rng.normal(size=5000))
    assert all(v is None for v in series_drift(small, big).values())
    assert all(v is None for v in series_drift(big, small).values())
    out = series_drift(summarise(rng.normal(size=MIN_COUNT)), big)
    assert out["psi"] is not None and out["ks"] is not None
    assert out["class_share_change"] is None  # no classes counted


def test_nan_rate_and_class_share_changes() -> None:
    rng = np.random.default_rng(7)
    clean = rng.uniform(size=(4000, 3))
    dirty = clean.copy()
    dirty[:200, 0] = np.nan  # 5% of requests, one of three elements each
    ref = summarise_batch(list(clean), "scores")
    cur = summarise_batch(list(dirty), "scores")
    out = drift(cur, ref)
    assert out["nan_rate_change"] == pytest.approx(200 / 12_000)
    assert out["class_share_change"] is not None and out["class_share_change"] > 0.0
    assert drift(cur, None) == dict.fromkeys(out)


def test_summary_primary_prefers_the_norm_of_a_large_output() -> None:
    s = Summary(series={"output:head": SeriesStats(), "output:norm": SeriesStats()})
    found = s.primary()
    assert found is not None and found[0] == "output:norm"


def test_each_version_is_judged_against_its_baseline_else_stable_else_nothing() -> None:
    from batchfleet.connectors.output_report import build_rows
    from batchfleet.connectors.output_stats import Baseline
    from batchfleet.schemas.registry import RolloutPolicy

    rng = np.random.default_rng(8)

    def side(mean: float) -> Summary:
        return summarise_batch(list(rng.normal(mean, 1.0, size=(3000, 1))), "regression")

    live = {("v1", "outputs"): side(0.0), ("v2", "outputs"): side(1.0),
            ("v3", "outputs"): side(0.0), ("old", "outputs"): side(0.0)}
    policy = RolloutPolicy(stable="v1", canary="v2", percent=10, shadow="v3")
    rows = {r.version: r for r in build_rows(live, policy, {})}
    assert [r.version for r in build_rows(live, policy, {})] == ["v1", "v2", "v3", "old"]
    assert (rows["v1"].role, rows["v1"].outputs.reference) == ("stable", None)
    assert rows["v1"].outputs.drift["psi"] is None
    assert (rows["v2"].role, rows["v2"].outputs.reference) == ("canary", "stable")
    assert (rows["v3"].role, rows["old"].role) == ("shadow", "pinned")
    psi_v2, psi_v3 = rows["v2"].outputs.drift["psi"], rows["v3"].outputs.drift["psi"]
    assert psi_v2 is not None and psi_v2 > 0.25
    assert psi_v3 is not None and psi_v3 < 0.05
    base = Baseline("v1", 0.0, 60.0, {"outputs": side(1.0)})
    with_base = {r.version: r for r in build_rows(live, policy, {"v1": base})}
    assert with_base["v1"].outputs.reference == "baseline"
    got = with_base["v1"].outputs.drift["psi"]
    assert got is not None and got > 0.25
    body = with_base["v2"].to_json(inputs=True)
    assert set(body) == {"version", "role", "reference", "count", "nan_rate", "mean", "p50",
                         "p99", "psi", "ks", "inputs"}
    assert body["inputs"]["count"] == 0 and body["inputs"]["psi"] is None


def test_per_feature_moments_merge_round_trip_and_show_one_features_shift() -> None:
    from batchfleet.connectors.output_drift import mean_shift

    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(3000, 10)), rng.normal(size=(3000, 10))
    half = summarise_batch(list(a[:1000]), None)
    half.merge(summarise_batch(list(a[1000:]), None))
    whole = summarise_batch(list(a), None).series["output"]
    got = half.series["output"]
    assert got.col_rows == whole.col_rows == 3000
    assert got.col_sums == pytest.approx(whole.col_sums)
    ints, floats = to_fields(half)
    back = from_fields({**{k: str(v) for k, v in ints.items()},
                        **{k: repr(v) for k, v in floats.items()}}).series["output"]
    assert back.col_rows == 3000 and back.col_squares == pytest.approx(got.col_squares)
    same = summarise_batch(list(b), None).series["output"]
    assert (mean_shift(same, got) or 0.0) < 0.15  # noise: about sqrt(2/3000) per feature
    b[:, 3] += 1.0
    moved = summarise_batch(list(b), None).series["output"]
    assert mean_shift(moved, got) == pytest.approx(1.0, abs=0.1)
    assert psi(moved.buckets, got.buckets) < 0.05  # the pooled histogram barely sees it
    assert mean_shift(summarise_batch(list(b[:100]), None).series["output"], got) is None
    nan_batch = b.copy()
    nan_batch[0, 0] = np.nan  # a batch holding NaN keeps no per-feature moments
    assert summarise_batch(list(nan_batch), None).series["output"].col_rows == 0


def test_an_image_summary_norm_is_numpys_without_a_float64_copy() -> None:
    """A float32[3,224,224] request's ``:norm`` is numpy's float64 norm (to 1e-6), though
    the rows are never copied whole to float64."""
    rows = np.random.default_rng(3).standard_normal((5, 3, 224, 224)).astype(np.float32) * 4
    want = np.linalg.norm(rows.reshape(5, -1).astype(np.float64), axis=1)
    got = row_norms(rows.reshape(5, -1))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    norm = summarise_batch(list(rows), None).series["output:norm"]
    assert norm.count == 5
    assert norm.total == pytest.approx(float(want.sum()), rel=1e-6)
    assert norm.squares == pytest.approx(float((want.astype(np.float32) ** 2).sum()), rel=1e-5)


def test_requests_with_a_nan_are_counted_once_merged_and_round_tripped() -> None:
    """A NaN row of float32[10] is 10 NaN values but one request; ``nan_rows`` counts
    requests (across named tensors, once each), merges by addition and survives the wire."""
    from batchfleet.workers.output_evidence import evidence_of

    rows = np.random.default_rng(5).standard_normal((300, 10)).astype(np.float32)
    rows[[3, 50, 200]] = np.nan
    plain = summarise_batch(list(rows), "scores")
    assert plain.series["output"].nan == 30 and plain.nan_rows == 3
    named = summarise_batch([{"a": r, "b": np.array([r[0], 1.0], np.float32)} for r in rows], None)
    assert named.nan_rows == 3  # the same three requests, NaN in both tensors
    merged = Summary()
    merged.merge(plain)
    merged.merge(named)
    assert merged.nan_rows == 6
    back = from_fields({k: str(v) for k, v in {**to_fields(merged)[0]}.items()})
    assert back.nan_rows == 6
    assert "nan_rows" not in to_fields(summarise_batch(list(rows[:3] * 0), None))[0]
    clean = summarise_batch(list(np.zeros((300, 10), np.float32)), "scores")
    found = evidence_of({("c", "outputs"): plain, ("s", "outputs"): clean}, "c", "s")
    assert found is not None
    assert (found[0].rows, found[0].nan_rows, found[0].nan_count) == (300, 3, 30)
