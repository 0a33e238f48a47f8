from __future__ import annotations

import pytest

from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.connectors.values import DeadLetter
from batchfleet.schemas.names import Names
from tests.support.seams import open_result_store

pytestmark = pytest.mark.integration
NAMES = Names("t")


async def test_due_items_are_claimed_once_under_a_lease(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    schedule = RetrySchedule(store.redis, NAMES)
    try:
        await schedule.add([(100.0, b"a"), (200.0, b"b"), (300.0, b"c")])
        assert sorted(await schedule.claim_due(now=250.0, lease_s=30)) == [b"a", b"b"]
        assert await schedule.claim_due(now=260.0, lease_s=30) == []  # leased, not due
        # the claimer "died": after the lease they come due again
        assert sorted(await schedule.claim_due(now=281.0, lease_s=30)) == [b"a", b"b"]
        await schedule.done([b"a", b"b"])
        assert await schedule.size() == 1 and await schedule.next_due() == 300.0
    finally:
        await store.close()


async def test_dead_letter_queue_round_trip(redis_url: str) -> None:
    store = open_result_store(redis_url, NAMES)
    dlq = DeadLetterQueue(store.redis, NAMES)
    try:
        errors = [{"attempt": 1, "type": "model_error", "message": "x", "at": 1.0}]
        await dlq.add([DeadLetter("r1", "m1", b"env", 1, errors, "model_error"),
                       DeadLetter("r2", "m2", b"env2", 3, errors, "model_error")])
        assert await dlq.models() == ["m1", "m2"]
        [letter] = await dlq.list("m1")
        assert (letter.request_id, letter.envelope, letter.errors) == ("r1", b"env", errors)
        assert await dlq.remove([letter]) == 1 and await dlq.size("m1") == 0
        assert await dlq.purge("m2") == 1
    finally:
        await store.close()
