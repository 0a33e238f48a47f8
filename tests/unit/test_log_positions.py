"""Telling Kafka's first deliveries from redeliveries by their log's claim
(``workers.log_positions``): the pure decisions, then the whole step on ``memory://``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest

from batchfleet.connectors import open_control_plane
from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.values import LogClaim, LogPosition
from batchfleet.workers.log_positions import (
    CLOCK_SKEW_MS,
    claims_for,
    delivery_count,
    tell_first_deliveries,
)

pytestmark = pytest.mark.unit

T = 1_764_000_000_000


def at(offset: int, stamp: int = T, log: str = "g/t/0", count: int | None = None) -> Delivery:
    return Delivery("m", "interactive", b"", ("tp", offset, 0), delivery_count=count,
                    position=LogPosition(log, offset, stamp))


def test_claims_are_per_log_the_highest_offset_and_newest_timestamp() -> None:
    positions = [LogPosition("a", 5, T + 2), LogPosition("b", 1, T), LogPosition("a", 7, T),
                 LogPosition("a", 6, -1)]
    assert claims_for(positions, T) == [("a", 7, T + 2), ("b", 1, T)]


def test_a_record_stamped_in_the_future_dates_its_claim_no_further_than_the_skew() -> None:
    """A producer whose clock runs a day ahead must not date the claim a day ahead: a log
    that went back later would have its new records taken for redeliveries."""
    a_day_ahead = LogPosition("a", 3, T + 86_400_000)
    assert claims_for([a_day_ahead], T) == [("a", 3, T + CLOCK_SKEW_MS)]
    # and that record, redelivered, is newer than its claim: counted as unknown, safely
    assert delivery_count(a_day_ahead, LogClaim(3, T + CLOCK_SKEW_MS)) is None


@pytest.mark.parametrize(("offset", "stamp", "expected"), [
    (10, T, 1),  # above everything handed out: never delivered before
    (9, T, 2),  # at the claim, no newer than its records: handed out before
    (3, T - 50, 2),
    (3, T + 1, None),  # newer than anything claimed: the log went back, cannot tell
    (3, -1, None),  # no timestamp to tell by
    (10, -1, 1),
])
def test_a_position_against_the_claim_before_it(offset: int, stamp: int,
                                                expected: int | None) -> None:
    assert delivery_count(LogPosition("a", offset, stamp), LogClaim(9, T)) == expected


async def test_a_fetch_claims_once_and_its_redelivery_is_seen_the_first_time() -> None:
    plane = open_control_plane(f"memory://positions-{uuid.uuid4().hex[:8]}", result_ttl_s=60)
    calls: list[list[tuple[str, int, int]]] = []

    async def claim(claims: Sequence[tuple[str, int, int]]) -> list[LogClaim]:
        calls.append(list(claims))
        return await plane.results.claim_positions(claims)

    try:
        first = [at(i) for i in range(4)] + [at(0, log="g/t/1")]
        redis_like = Delivery("m", "interactive", b"", "entry", delivery_count=1)
        await tell_first_deliveries([*first, redis_like], claim)
        assert [d.delivery_count for d in first] == [1, 1, 1, 1, 1]
        assert calls == [[("g/t/0", 3, T), ("g/t/1", 0, T)]]  # one call, one claim a log
        # the worker died: the group hands offsets 2.. out again, with records never fetched
        again = [at(2), at(3), at(4, T + 9), at(1, T + 9, log="g/t/1")]
        await tell_first_deliveries(again, claim)
        assert [d.delivery_count for d in again] == [2, 2, 1, 1]
        # a broker restarted empty: offset 0 again, newer than anything claimed
        reborn = [at(0, T + 60_000)]
        await tell_first_deliveries(reborn, claim)
        assert reborn[0].delivery_count is None
        counted = [at(3, count=2)]  # a count already known is left alone, and costs no call
        before = len(calls)
        await tell_first_deliveries(counted, claim)
        assert counted[0].delivery_count == 2 and len(calls) == before
    finally:
        await plane.close()
