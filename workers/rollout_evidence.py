"""The seam between the rollout guard and the output statistics (issue 27).

The guard judges a canary's *outputs* only through this module's two names, so the
statistics store (per-version output summaries merged in the control plane) and the
guard's tests (hand-made evidence) meet here and nowhere else. A source answers for
one model's canary and stable over the same windows, since the policy epoch began.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class OutputEvidence:
    """One version's outputs over a period, merged over the fleet."""

    #: Values counted (the documented summary values of each output), for display.
    count: int
    nan_count: int
    #: PSI of this version's outputs against the other side's; None below the
    #: minimum counts (a small-sample PSI is mostly bias).
    psi: float | None
    #: Requests counted, and those with a NaN in any output: what the NaN test counts
    #: (a NaN poisons a row, so a row's elements are not independent samples).
    rows: int = 0
    nan_rows: int = 0


class EvidenceSource(Protocol):
    """Where the guard reads output evidence: ``(canary's, stable's)``, in the order of
    the arguments, over the same windows since ``since_unix_s`` (the policy epoch's
    start); None from a source that has none yet."""

    async def output_evidence(self, model: str, canary: str, stable: str, since_unix_s: float
                              ) -> tuple[OutputEvidence, OutputEvidence] | None: ...
