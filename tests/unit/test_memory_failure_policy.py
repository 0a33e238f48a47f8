"""The failure policy and the retry pump on ``memory://``: retries wait in the schedule,
come back through the broker with their next attempt, and end in the DLQ with their
history; a stale copy is dropped. No server: these run in milliseconds."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest

from batchfleet.connectors import TerminalWrite
from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.memory_broker import open_memory_broker
from batchfleet.connectors.memory_plane import MemoryControlPlane, open_memory_control_plane
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.schemas.envelopes import ErrorInfo, Request, decode_request, encode_request
from batchfleet.schemas.names import LANE_INTERACTIVE, Names
from batchfleet.workers.intake import Job
from batchfleet.workers.retry import RetryConfig, RetryingFailurePolicy, RetryPump

pytestmark = pytest.mark.unit
NAMES = Names("fp")
BOOM = ErrorInfo("model_error", "boom", True)


def seams(plane: MemoryControlPlane) -> tuple[Any, Any]:
    """The retry schedule and DLQ; ``workers.retry`` still names the Redis classes in its
    signatures (issue 24 moves it to the protocols), hence Any."""
    return plane.retry_schedule, plane.dead_letters


@pytest.fixture
def url() -> str:
    return f"memory://policy-{uuid.uuid4().hex[:8]}"


async def _deliver(url: str, req: Request) -> Job:
    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w1")
    await consumer.start([req.model])
    await broker.publisher().publish([OutboundMessage(req.model, req.lane, req.request_id,
                                                      encode_request(req))])
    [delivery] = await consumer.fetch(10, 1.0)
    await consumer.ack([delivery])
    return Job(delivery, decode_request(delivery.payload))


async def test_a_retry_comes_back_with_its_next_attempt_then_dead_letters(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES)
    now = [1000.0]
    policy = RetryingFailurePolicy(*seams(plane),
                                   RetryConfig(max_attempts=2, base_s=1.0, cap_s=1.0),
                                   rand=lambda: 1.0, clock=lambda: now[0])
    req = Request("r1", "m", np.zeros(2, np.float32), LANE_INTERACTIVE)
    await plane.results.put_pending([("r1", b"pending")])
    job = await _deliver(url, req)

    first = await policy.on_failures([(job, BOOM)])
    assert first.rescheduled == [job.delivery] and not first.answers
    assert await plane.retry_schedule.next_due() == pytest.approx(1001.0)

    broker = open_memory_broker(url, names=NAMES)
    consumer = broker.consumer("w2")
    await consumer.start(["m"])
    pump = RetryPump(seams(plane)[0], broker.publisher())
    assert await pump.pump_once() == 1  # due (the schedule's clock is wall time)
    [again] = await consumer.fetch(10, 1.0)
    retried = decode_request(again.payload)
    assert (retried.attempt, [h["type"] for h in retried.history]) == (2, ["model_error"])
    assert await plane.retry_schedule.size() == 0

    last = await policy.on_failures([(Job(again, retried), BOOM)])
    assert last.dead_lettered == [("m", LANE_INTERACTIVE)]
    [answer] = last.answers
    error = answer.result.error
    assert answer.result.status == "failed" and error and "dead-lettered" in error.message
    [letter] = await plane.dead_letters.list("m")
    assert (letter.request_id, letter.attempts, len(letter.errors)) == ("r1", 2, 2)
    reset_memory(url)


async def test_a_finished_or_replayed_request_is_never_retried(url: str) -> None:
    plane = open_memory_control_plane(url, NAMES)
    policy = RetryingFailurePolicy(*seams(plane),
                                   RetryConfig(max_attempts=3))
    done = await _deliver(url, Request("done", "m", np.zeros(2, np.float32)))
    await plane.results.put_pending([("done", b"p")])
    await plane.results.write_terminal([TerminalWrite("done", "succeeded", b"s")])
    stale = await _deliver(url, Request("stale", "m", np.zeros(2, np.float32), generation=0))
    await plane.results.put_pending([("stale", b"p")])
    await plane.results.write_terminal([TerminalWrite("stale", "failed", b"f")])
    assert await plane.results.reopen_for_replay([("stale", b"p")]) == [1]
    out = await policy.on_failures([(done, BOOM), (stale, BOOM)])
    assert out.superseded == [done.delivery, stale.delivery] and not out.rescheduled
    assert await plane.retry_schedule.size() == 0
    reset_memory(url)
