"""The ``error`` trigger: the failure policy, wrapped.

The inner policy (retries with backoff, then the DLQ) runs first and unchanged, so a
request that fails for good is still dead-lettered, replayable for a real answer. Only
its terminal ``failed`` answer is swapped: for a degraded one when the model's chain
answers, or for ``unavailable`` when the request said ``degrade="never"``. Bad input
(``validation_error`` and kin) is never degraded: it is the caller's failure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from batchfleet.schemas.envelopes import ErrorInfo
from batchfleet.workers.failures import Disposition, FailurePolicy
from batchfleet.workers.jobs import Answer, Job

#: Failures of the model itself (after retries), which the ``error`` trigger answers.
DEGRADABLE: Final = frozenset({"model_error", "output_mismatch", "timeout", "stalled", "oom",
                               "crash_loop"})
#: Of those, failures only steps that compute nothing (``chain.INERT``) may answer: a
#: quarantined request killed the worker each time it ran, and a ``model:`` or ``rules:``
#: step in the same process could too (then it is redelivered, quarantined, and run
#: through the fallback again, forever).
INERT_ONLY: Final = frozenset({"crash_loop"})

#: (failed jobs, each one's error by request ID) -> (answers, jobs left failed).
Degrader = Callable[[Sequence[Job], dict[str, ErrorInfo]],
                    Awaitable[tuple[list[Answer], list[Job]]]]


def degradable(answer: Answer) -> bool:
    error = answer.result.error
    return answer.result.status == "failed" and error is not None and error.type in DEGRADABLE


class DegradingPolicy:
    """``inner``'s disposition, with the terminal failures of ``models`` handed to
    ``degrade`` (a model's chain, or fail-closed answers)."""

    def __init__(self, inner: FailurePolicy, models: frozenset[str], degrade: Degrader) -> None:
        self._inner = inner
        self._models = models
        self._degrade = degrade

    async def on_failures(self, failed: Sequence[tuple[Job, ErrorInfo]]) -> Disposition:
        out = await self._inner.on_failures(failed)
        jobs = {id(job.delivery): job for job, _ in failed}
        picked: list[tuple[int, Job]] = []
        for i, answer in enumerate(out.answers):
            job = jobs.get(id(answer.delivery))
            if job is not None and job.request.model in self._models and degradable(answer):
                picked.append((i, job))
        if not picked:
            return out
        errors = {job.request.request_id: out.answers[i].result.error for i, job in picked}
        answered, _ = await self._degrade([job for _, job in picked],
                                          {k: v for k, v in errors.items() if v is not None})
        by_delivery = {id(a.delivery): a for a in answered}
        for i, _job in picked:
            found = by_delivery.get(id(out.answers[i].delivery))
            if found is not None:
                out.answers[i] = found
        return out
