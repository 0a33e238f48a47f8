"""Review fixes in the fallback chain's triggers, on the ``Degrade`` middleware itself:
a quarantined request is answered only by steps that compute nothing, ..."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from batchfleet.schemas.envelopes import ErrorInfo, Request
from batchfleet.workers.fallback.chain import parse_chain
from batchfleet.workers.fallback.middleware import Degrade
from batchfleet.workers.fallback.steps import ChainRunner
from batchfleet.workers.jobs import Job
from batchfleet.workers.runner import BatchRun

pytestmark = pytest.mark.unit


def _job(model: str = "m", **kw: Any) -> Job:
    return Job(None, Request(uuid.uuid4().hex, model, np.zeros(3, np.float32), **kw))  # type: ignore[arg-type]


def _degrade(chain_text: str) -> tuple[Degrade, list[str]]:
    """A ``Degrade`` for model ``m`` whose ``model:`` and ``rules:`` steps note each run."""
    chain = parse_chain(chain_text)
    mw = Degrade({"m": chain}, {"m": frozenset({"error"})}, cache_on={})
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
