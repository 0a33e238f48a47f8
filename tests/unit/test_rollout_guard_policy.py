"""The guard's policy fields and the agreement gate: the wire form (new keys optional and
written only when set), the flags' merge, the refusal's reason, and memory:// parity (the
same ``Rollouts`` over the memory seams refuses and forces as over Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from batchfleet.cli_rollout import describe_guard, guard_with
from batchfleet.connectors import open_control_plane
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.connectors.rollout import agreement_refusal
from batchfleet.connectors.rollout_stats import ComparisonDelta, Difference, Histogram, ShadowReport
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.registry import GuardThresholds, ModelVersion, RolloutPolicy

pytestmark = pytest.mark.unit


def test_new_guard_keys_are_optional_on_the_wire() -> None:
    assert GuardThresholds().to_wire() == {"error_points": 5.0, "p99_ratio": 2.0,
                                           "min_window": 200}  # older bytes unchanged
    full = GuardThresholds(psi=0.2, nan_points=1.0, agreement=0.9)
    assert full.to_wire() == {"error_points": 5.0, "p99_ratio": 2.0, "min_window": 200,
                              "psi": 0.2, "nan_points": 1.0, "agreement": 0.9}
    assert GuardThresholds.from_wire(full.to_wire()) == full
    assert GuardThresholds.from_wire(GuardThresholds().to_wire()) == GuardThresholds()
    policy = RolloutPolicy("v1", canary="v2", percent=5, guard=full)
    assert RolloutPolicy.from_wire(policy.to_wire()) == policy


@pytest.mark.parametrize("bad", [{"psi": 0.0}, {"psi": -1.0}, {"nan_points": 0.0},
                                 {"nan_points": 101.0}, {"agreement": 0.0},
                                 {"agreement": 1.5}])
def test_guard_fields_out_of_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        GuardThresholds(**bad)  # type: ignore[arg-type]


def test_flags_merge_into_the_old_thresholds_and_zero_turns_a_check_off() -> None:
    old = GuardThresholds(error_points=3.0, psi=0.2, agreement=0.9)
    new = guard_with(old, {"error_points": None, "p99_ratio": 4.0, "min_window": None,
                           "psi": 0.0, "nan_points": 2.0, "agreement": None})
    assert new == GuardThresholds(3.0, 4.0, 200, None, 2.0, 0.9)
    assert describe_guard(new) == ("errors +3 points, p99 4x, window 200 requests, PSI off, "
                                   "NaN +2 points, agreement 0.9")
    assert "NaN off" in describe_guard(GuardThresholds())


def _report(shadow: str, stable: str, compared: int, agree: int) -> ShadowReport:
    return ShadowReport("m", 3, stable, shadow, compared, 0, 0, agree, 0.0, compared, 0.0,
                        {"stable": Histogram(), "shadow": Histogram()}, [], {})


def test_agreement_refusal_names_the_numbers_and_the_override() -> None:
    low = _report("v2", "v1", 400, 300)
    why = agreement_refusal(low, "v2", "v1", 0.9, "promote 'v2'")
    assert why == ("refusing to promote 'v2': its recorded shadow arg-max agreement with "
                   "stable 'v1' is 75.00% over 400 compared requests (epoch 3), below the "
                   "guard's 90.00% (--guard-agreement); --force (force=True) overrides")
    assert agreement_refusal(low, "v2", "v1", None, "x") is None  # no threshold
    assert agreement_refusal(low, "v2", "v1", 0.75, "x") is None  # at the threshold
    assert agreement_refusal(low, "v3", "v1", 0.9, "x") is None  # another version's record
    assert agreement_refusal(low, "v2", "v0", 0.9, "x") is None  # against another stable
    assert agreement_refusal(None, "v2", "v1", 0.9, "x") is None  # nothing recorded
    assert agreement_refusal(_report("v2", "v1", 0, 0), "v2", "v1", 0.9, "x") is None


@pytest.fixture
def url() -> Iterator[str]:
    found = f"memory://unit-{uuid.uuid4().hex[:8]}"
    yield found
    reset_memory(found)


async def test_memory_plane_stores_the_fields_and_gates_canary_and_promote(url: str) -> None:
    plane = open_control_plane(url)
    rollouts = plane.rollouts
    await plane.models.serve("w1", {"m": [ModelVersion("v1", "sha:1"),
                                          ModelVersion("v2", "sha:2")]})
    guard = GuardThresholds(psi=0.25, nan_points=1.0, agreement=0.9)
    shadowing = await rollouts.set("m", stable="v1", shadow="v2", guard=guard, who="t")
    assert (await plane.models.get_policy("m")).guard == guard
    assert (await rollouts.status("m")).to_json()["policy"]["guard"]["psi"] == 0.25
    delta = ComparisonDelta(stable="v1", shadow="v2")
    for agrees in [True] * 60 + [False] * 40:  # 60% agreement
        delta.add(Difference(0.5, 0.5, 1, agrees))
    await plane.rollout_stats.flush_comparisons("m", shadowing.epoch, delta)

    with pytest.raises(ValidationError, match=r"refusing to make 'v2' the canary: .* 60\.00% "
                                              r"over 100 compared requests"):
        await rollouts.set("m", stable="v1", canary="v2", percent=10, who="t")
    assert (await plane.models.get_policy("m")).epoch == shadowing.epoch  # nothing written
    forced = await rollouts.set("m", stable="v1", canary="v2", percent=10, who="t", force=True)
    assert forced.canary == "v2"
    # the same canary at another percent is not a new canary: no gate
    assert (await rollouts.set("m", stable="v1", canary="v2", percent=20, who="t")).percent == 20
    with pytest.raises(ValidationError, match="refusing to promote 'v2'"):
        await rollouts.promote("m", who="t")
    assert (await rollouts.promote("m", who="t", force=True)).stable == "v2"
    await plane.close()
