"""The rollout guard's output evidence from the output statistics (issue 27's seam,
``workers/rollout_evidence.py``): a canary's and stable's outputs over the same windows
since the policy epoch began, fleet-merged, and the canary's PSI against stable."""

from __future__ import annotations

from collections.abc import Mapping

from batchfleet.connectors.output_drift import MIN_COUNT, drift
from batchfleet.connectors.output_summary import Summary
from batchfleet.workers.rollout_evidence import OutputEvidence


def evidence_of(live: Mapping[tuple[str, str], Summary], canary: str, stable: str,
                min_count: int = MIN_COUNT) -> tuple[OutputEvidence, OutputEvidence] | None:
    """(canary's, stable's) evidence from merged windows; None until both have outputs.
    ``count`` and ``nan_count`` are over every output series, ``rows`` and ``nan_rows``
    over requests (a request with a NaN in any output counts once); ``psi`` is the canary's
    against stable (the largest over series; None below ``min_count`` values a side),
    and stable's own is 0 (it is the reference)."""
    can, base = live.get((canary, "outputs")), live.get((stable, "outputs"))
    if can is None or base is None or can.empty or base.empty:
        return None

    def of(s: Summary, psi: float | None) -> OutputEvidence:
        return OutputEvidence(sum(x.count for x in s.series.values()),
                              sum(x.nan for x in s.series.values()), psi, s.rows, s.nan_rows)

    psi = drift(can, base, min_count)["psi"]
    return of(can, psi), of(base, None if psi is None else 0.0)
