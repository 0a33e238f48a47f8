"""One row per version of a model: its statistics over a period and its drift against
its reference (``models outputs``, ``GET /v1/models/{model}/outputs``, the Prometheus
gauges and the rollout guard's evidence all read this).

The reference of a version, in order: its frozen baseline (``models baseline``); else,
for any version but the stable one (a canary, a shadow, a version requests pin), the
stable version's live statistics over the same period (the same windows); else none
(stable without a baseline), and its drift is null.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchfleet.connectors.output_drift import MIN_COUNT, drift
from batchfleet.connectors.output_stats import Baseline
from batchfleet.connectors.output_summary import Summary
from batchfleet.schemas.registry import DEFAULT_LABEL, RolloutPolicy

if TYPE_CHECKING:
    from batchfleet.connectors.control_plane import ControlPlane

#: The period ``models outputs`` and the console's panel cover by default (seconds).
DEFAULT_SINCE_S = 900.0


def role_of(policy: RolloutPolicy | None, label: str) -> str:
    """stable, canary, shadow, or pinned (reached only by a request naming it)."""
    if policy is None:
        return "stable" if label == DEFAULT_LABEL else "pinned"
    if label == policy.stable:
        return "stable"
    if label == policy.canary:
        return "canary"
    return "shadow" if label == policy.shadow else "pinned"


@dataclass(frozen=True, slots=True)
class SideRow:
    """One side (outputs or inputs) of one version."""

    reference: str | None
    summary: Summary
    drift: dict[str, float | None]
    #: The reference's statistics (None without one).
    ref: Summary | None = None

    @property
    def count(self) -> int:
        """Values counted over every series (``output_summary``)."""
        return sum(s.count for s in self.summary.series.values())

    @property
    def nan_count(self) -> int:
        return sum(s.nan for s in self.summary.series.values())

    def to_json(self) -> dict[str, Any]:
        count, primary = self.count, self.summary.primary()
        stats = primary[1] if primary is not None else None
        return {"reference": self.reference, "count": count,
                "nan_rate": round(self.nan_count / count, 6) if count else None,
                "mean": _round(stats.mean if stats else None),
                "p50": _round(stats.quantile(0.5) if stats else None),
                "p99": _round(stats.quantile(0.99) if stats else None),
                "psi": _round(self.drift["psi"]), "ks": _round(self.drift["ks"])}


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: str
    role: str
    outputs: SideRow
    inputs: SideRow

    def to_json(self, inputs: bool = False) -> dict[str, Any]:
        """``version``, ``role``, ``reference``, ``count``, ``nan_rate``, ``mean``,
        ``p50``, ``p99``, ``psi``, ``ks``; with ``inputs``, the same under ``inputs``."""
        out = {"version": self.version, "role": self.role, **self.outputs.to_json()}
        if inputs:
            out["inputs"] = self.inputs.to_json()
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def reference_of(label: str, role: str, policy: RolloutPolicy | None,
                 baselines: dict[str, Baseline], live: dict[tuple[str, str], Summary],
                 side: str) -> tuple[str | None, Summary | None]:
    """Which reference a version's side is judged against, and its statistics."""
    if label in baselines:
        return "baseline", baselines[label].sides.get(side, Summary())
    stable = policy.stable if policy is not None else DEFAULT_LABEL
    if role != "stable" and stable != label:
        return "stable", live.get((stable, side), Summary())
    return None, None


def build_rows(live: dict[tuple[str, str], Summary], policy: RolloutPolicy | None,
               baselines: dict[str, Baseline], min_count: int = MIN_COUNT
               ) -> list[VersionRow]:
    """The rows, stable first, then canary, shadow, and the rest by label (pure)."""
    labels = {label for label, _ in live} | set(policy.labels if policy else ())
    order = {"stable": 0, "canary": 1, "shadow": 2, "pinned": 3}
    rows = []
    for label in labels:
        role = role_of(policy, label)
        sides = {}
        for side in ("outputs", "inputs"):
            ref_name, ref = reference_of(label, role, policy, baselines, live, side)
            current = live.get((label, side), Summary())
            sides[side] = SideRow(ref_name, current, drift(current, ref, min_count), ref)
        rows.append(VersionRow(label, role, sides["outputs"], sides["inputs"]))
    return sorted(rows, key=lambda r: (order[r.role], r.version))


async def read_rows(plane: ControlPlane, model: str, since_s: float,
                    now: float | None = None, min_count: int = MIN_COUNT
                    ) -> list[VersionRow]:
    """The rows over the last ``since_s`` seconds (three round trips)."""
    now = time.time() if now is None else now
    policy = (await plane.models.policies([model])).get(model)
    live = await plane.output_stats.read(model, now - since_s)
    labels = {label for label, _ in live} | set(policy.labels if policy else ())
    baselines = await plane.output_stats.baselines(model, labels)
    return build_rows(live, policy, baselines, min_count)


async def freeze_baseline(plane: ControlPlane, model: str, label: str, since_s: float,
                          now: float | None = None) -> Baseline:
    """Freeze a version's statistics over the last ``since_s`` seconds as its baseline."""
    now = time.time() if now is None else now
    live = await plane.output_stats.read(model, now - since_s)
    baseline = Baseline(label, now, since_s,
                        {side: live.get((label, side), Summary()) for side in ("outputs",
                                                                               "inputs")})
    await plane.output_stats.freeze(model, baseline)
    return baseline
