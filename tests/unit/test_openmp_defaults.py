"""The worker's OpenMP settings (``workers.openmp``): a short spin, then sleep; what an
operator set is kept."""

from __future__ import annotations

import pytest

from batchfleet.workers.openmp import SPIN_COUNT, openmp_defaults

pytestmark = pytest.mark.unit


def test_an_unset_environment_gets_a_short_spin_then_sleep() -> None:
    assert openmp_defaults({}, None) == {"OMP_WAIT_POLICY": "PASSIVE",
                                         "GOMP_SPINCOUNT": str(SPIN_COUNT)}


def test_the_operators_wait_policy_keeps_its_own_spin_count() -> None:
    # ACTIVE spins for minutes by default: our count would quietly override it
    assert openmp_defaults({"OMP_WAIT_POLICY": "ACTIVE"}, None) == {}
    assert openmp_defaults({"GOMP_SPINCOUNT": "0"}, None) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_torch_threads_become_openmps_thread_count() -> None:
    assert openmp_defaults({"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "4"}, 1) == {
        "OMP_NUM_THREADS": "1"}
