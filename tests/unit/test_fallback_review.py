"""Review fixes in the fallback chain's triggers, on the ``Degrade`` middleware itself:
a quarantined request is answered only by steps that compute nothing, and the
``overload`` trigger ages requests on the worker's clock, not the producer's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.envelopes import ErrorInfo, Request
from batchfleet.workers.fallback.chain import parse_chain
from batchfleet.workers.fallback.middleware import Degrade
from batchfleet.workers.fallback.steps import ChainRunner
from batchfleet.workers.jobs import Job
from batchfleet.workers.runner import BatchRun

pytestmark = pytest.mark.unit


def _job(model: str = "m", **kw: Any) -> Job:
    return Job(Delivery(model, "interactive", b"", token=None),
               Request(uuid.uuid4().hex, model, np.zeros(3, np.float32), **kw))


def _degrade(chain_text: str, trigger: str = "error", **kw: Any) -> tuple[Degrade, list[str]]:
    """A ``Degrade`` for model ``m`` whose ``model:`` and ``rules:`` steps note each run."""
    chain = parse_chain(chain_text)
    mw = Degrade({"m": chain}, {"m": frozenset({trigger})}, cache_on={}, **kw)
    ran: list[str] = []

    async def run_model(lane: str, jobs: Sequence[Job]) -> BatchRun:
        ran.append(f"model:{lane}")
        return BatchRun([np.ones(1, np.float32) for _ in jobs], 0.0, 0.001, len(jobs))

    def rules(inputs: list[Any]) -> list[Any]:
        ran.append("rules")
        return [np.full(1, 2.0, np.float32) for _ in inputs]

    runner = ChainRunner("m", chain, run_model, lambda name, label: (name, "v"))
    runner.rules = {s: rules for s in chain.steps if s.kind == "rules"}
    runner.values = {s: np.full(1, 0.5, np.float32) for s in chain.steps if s.kind == "value"}
    mw.runners["m"] = runner
    return mw, ran


async def test_a_quarantined_request_is_answered_only_by_steps_that_compute_nothing() -> None:
    mw, ran = _degrade("model:backup|rules:tests.support.fallback_rules:score|value:[0.5]")
    poison, plain = _job(), _job()
    errors = {poison.request.request_id: ErrorInfo("crash_loop", "died 3 times", False),
              plain.request.request_id: ErrorInfo("model_error", "boom", True)}
    answered, left = await mw._on_errors([poison, plain], errors)
    assert not left
    by_id = {a.result.request_id: a.result for a in answered}
    assert by_id[poison.request.request_id].fallback == "value"  # model and rules skipped
    assert by_id[plain.request.request_id].fallback == "model:backup"  # unchanged
    assert ran == ["model:backup"]  # only for the plain failure


async def test_a_chain_of_only_computing_steps_fails_a_quarantined_request_closed() -> None:
    mw, ran = _degrade("model:backup|rules:tests.support.fallback_rules:score")
    poison = _job()
    errors = {poison.request.request_id: ErrorInfo("crash_loop", "died 3 times", False)}
    answered, left = await mw._on_errors([poison], errors)
    assert not answered and left == [poison] and ran == []


async def test_overload_ages_requests_on_the_workers_clock_not_the_producers() -> None:
    """A producer clock an hour ahead neither hides the request's wait at this worker nor
    makes it look older; one an hour behind is a request the broker held an hour (old)."""
    import asyncio
    import time

    from batchfleet.workers.intake import Intake
    from batchfleet.workers.middleware.base import Batch, BatchKey

    mw, _ = _degrade("value:[0.5]", "overload", shed_after_ms={"m": 200.0})
    now = time.time()
    ahead, behind, fresh = (_job(enqueued_at=now + 3600), _job(enqueued_at=now - 3600),
                            _job(enqueued_at=now))
    await mw.after_decode(Intake(jobs=[ahead, behind, fresh]))
    first = Batch(BatchKey(0, "m", None), [ahead, behind, fresh])
    await mw._shed(first)
    assert [a.result.request_id for a in first.answered] == [behind.request.request_id]
    assert first.jobs == [ahead, fresh]  # not shed: they only just arrived here

    later_ahead = _job(enqueued_at=time.time() + 3600)
    await mw.after_decode(Intake(jobs=[later_ahead]))
    await asyncio.sleep(0.3)  # it waits past the mark at this worker
    second = Batch(BatchKey(0, "m", None), [later_ahead])
    await mw._shed(second)
    assert [a.result.fallback for a in second.answered] == ["value"]  # overload not hidden
