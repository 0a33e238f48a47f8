"""The drift alerts of infra/prometheus/alerts.yml, evaluated on what a worker exports.

``promtool`` is not available, so the rules' expressions are parsed by ``promql-parser``
and evaluated here by a small instant-vector evaluator (selectors with label matchers,
``max|sum|min by (...)``, a comparison with a number, ``or``: the shapes the drift alerts
use)
over the samples of a real ``WorkerMetrics`` exposition, set from statistics of N(0,1)
inputs (the baseline) and then N(1,1) ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchfleet.connectors.output_report import build_rows
from batchfleet.connectors.output_stats import Baseline
from batchfleet.connectors.output_summary import summarise_batch
from batchfleet.workers.metrics import WorkerMetrics
from batchfleet.workers.middleware.output_stats import publish

pytestmark = pytest.mark.unit

ALERTS = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "alerts.yml"
Series = dict[tuple[tuple[str, str], ...], float]


def _rule(name: str) -> str:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == name:
                return str(rule["expr"])
    raise LookupError(name)


def _samples(metrics: WorkerMetrics) -> list[tuple[str, dict[str, str], float]]:
    raw = metrics.exposition().decode()
    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(raw) for s in fam.samples]


def evaluate(node: Any, samples: list[tuple[str, dict[str, str], float]]) -> Series:
    """An instant vector: label set -> value."""
    if isinstance(node, promql_parser.VectorSelector):
        out: Series = {}
        for name, labels, value in samples:
            if name != node.name:
                continue
            ok = True
            for m in node.matchers.matchers:
                got, op = labels.get(m.name, ""), str(m.op)
                ok &= {"Equal": got == m.value, "NotEqual": got != m.value,
                       "Re": re.fullmatch(m.value, got) is not None,
                       "NotRe": re.fullmatch(m.value, got) is None}[op.rsplit(".", 1)[-1]]
            if ok:
                out[tuple(sorted({**labels, "__name__": name}.items()))] = value
        return out
    if isinstance(node, promql_parser.ParenExpr):
        return evaluate(node.expr, samples)
    if isinstance(node, promql_parser.AggregateExpr):
        inner = evaluate(node.expr, samples)
        keep = list(node.modifier.labels)
        groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for labels, value in inner.items():
            d = dict(labels)
            groups.setdefault(tuple((k, d.get(k, "")) for k in keep), []).append(value)
        agg = {"max": max, "min": min, "sum": sum}[str(node.op)]
        return {k: float(agg(v)) for k, v in groups.items()}
    if isinstance(node, promql_parser.BinaryExpr) and str(node.op) == "or":
        left = evaluate(node.lhs, samples)  # every left element, and the right ones whose
        right = evaluate(node.rhs, samples)  # label set the left side lacks
        return {**{k: v for k, v in right.items() if k not in left}, **left}
    if isinstance(node, promql_parser.BinaryExpr):
        assert isinstance(node.rhs, promql_parser.NumberLiteral), "only VECTOR op NUMBER"
        vector, bound = evaluate(node.lhs, samples), float(node.rhs.val)
        test = {">": lambda v: v > bound, "<": lambda v: v < bound,
                ">=": lambda v: v >= bound}[str(node.op)]
        return {k: v for k, v in vector.items() if test(v)}
    raise NotImplementedError(type(node).__name__)


def _metrics_after(input_mean: float, features: slice = slice(None)) -> WorkerMetrics:
    """A worker's gauges after a version baselined on N(0,1) inputs sees inputs whose
    ``features`` are drawn from N(mean,1) (the others still N(0,1))."""
    rng = np.random.default_rng(11)

    def side(mean: float) -> dict[str, Any]:
        table = rng.normal(0.0, 1.0, size=(3000, 4))
        table[:, features] += mean
        rows = list(table)
        return {"inputs": summarise_batch(rows, None),
                "outputs": summarise_batch([np.array([0.5]) for _ in rows], "regression")}

    base, now = side(0.0), side(input_mean)
    rows = build_rows({("default", s): v for s, v in now.items()}, None,
                      {"default": Baseline("default", 0.0, 600.0, base)})
    metrics = WorkerMetrics()
    publish(metrics, "fraud", rows)
    return metrics


def test_the_input_drift_alert_fires_when_inputs_move_from_n01_to_n11() -> None:
    expr = promql_parser.parse(_rule("BatchfleetInputDrift"))
    fired = evaluate(expr, _samples(_metrics_after(1.0)))
    assert list(fired) == [(("model", "fraud"), ("version", "default"))]
    assert next(iter(fired.values())) > 0.25
    assert evaluate(expr, _samples(_metrics_after(0.0))) == {}  # the same traffic: quiet
    # the outputs did not move (a constant model): the output alert stays quiet
    assert evaluate(promql_parser.parse(_rule("BatchfleetOutputDrift")),
                    _samples(_metrics_after(1.0))) == {}


def test_the_input_drift_alert_fires_when_one_feature_of_four_moves() -> None:
    """One feature of four moved by one standard deviation: the pooled PSI stays low, the
    per-feature mean shift does not."""
    metrics = _metrics_after(1.0, slice(2, 3))
    samples = _samples(metrics)
    psi = metrics.output_drift.labels("fraud", "default", "input_psi")._value.get()
    assert psi < 0.25
    fired = evaluate(promql_parser.parse(_rule("BatchfleetInputDrift")), samples)
    assert list(fired) == [(("model", "fraud"), ("version", "default"))]
    assert next(iter(fired.values())) == pytest.approx(1.0, abs=0.1)


def test_the_nan_alert_reads_the_nan_ratio_gauge() -> None:
    metrics = WorkerMetrics()
    metrics.output_nan_ratio.labels("fraud", "v2").set(0.05)
    metrics.output_nan_ratio.labels("fraud", "v1").set(0.0)
    fired = evaluate(promql_parser.parse(_rule("BatchfleetOutputNaN")), _samples(metrics))
    assert list(fired) == [(("model", "fraud"), ("version", "v2"))]
