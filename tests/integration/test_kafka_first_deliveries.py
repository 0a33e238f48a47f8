"""Kafka's first deliveries told apart from redeliveries, on a real Kafka-protocol broker
and a real Redis: the claims a member raises before its records run tell the member after
it which offsets were handed out (``workers.log_positions``)."""

from __future__ import annotations

import time
import uuid

import pytest

from batchfleet.connectors.broker import Delivery
from batchfleet.schemas.names import LANE_INTERACTIVE, Names
from batchfleet.workers.log_positions import tell_first_deliveries
from tests.integration.test_kafka_transport import consumer, fetch_n, offsets, publish, running
from tests.support.seams import open_result_store

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.timeout(90)]


def counts(deliveries: list[Delivery]) -> dict[int, int | None]:
    return {d.token[1]: d.delivery_count for d in deliveries}


async def test_a_dead_members_records_come_back_as_redeliveries(
        kafka_broker: str, redis_url: str) -> None:
    names, group = Names(prefix=f"t{uuid.uuid4().hex[:10]}"), f"g-{uuid.uuid4().hex[:10]}"
    store = open_result_store(redis_url, names, ttl_s=600)
    try:
        await publish(kafka_broker, names, LANE_INTERACTIVE, 10, partitions=1)
        async with running(consumer(kafka_broker, names, group, partitions=1)) as first:
            got = await fetch_n(first, 10)
            await tell_first_deliveries(got, store.claim_positions)
            assert counts(got) == dict.fromkeys(range(10), 1)
            assert all(d.position is not None and d.position.timestamp_ms > 0 for d in got)
            await first.ack([d for d in got if d.token[1] < 4])  # 4..9 die with it
        await publish(kafka_broker, names, LANE_INTERACTIVE, 3, partitions=1)
        async with running(consumer(kafka_broker, names, group, partitions=1)) as second:
            again = await fetch_n(second, 9)
            assert offsets(again) == list(range(4, 13))
            await tell_first_deliveries(again, store.claim_positions)
            assert counts(again) == {**dict.fromkeys(range(4, 10), 2),
                                     **dict.fromkeys(range(10, 13), 1)}
            await second.ack(again)
    finally:
        await store.close()


async def test_a_log_that_went_back_is_not_taken_for_redeliveries(
        kafka_broker: str, redis_url: str) -> None:
    """A claim left by an older log at the same offsets (a broker restarted empty, a topic
    recreated): its records are newer than anything claimed, so their count stays
    unknown (counted as before) instead of running every one alone as a suspect."""
    names, group = Names(prefix=f"t{uuid.uuid4().hex[:10]}"), f"g-{uuid.uuid4().hex[:10]}"
    store = open_result_store(redis_url, names, ttl_s=600)
    try:
        log = f"{group}/{names.topic('m', LANE_INTERACTIVE)}/0"
        an_hour_ago = int((time.time() - 3600) * 1000)
        await store.claim_positions([(log, 1_000, an_hour_ago)])
        await publish(kafka_broker, names, LANE_INTERACTIVE, 5, partitions=1)
        async with running(consumer(kafka_broker, names, group, partitions=1)) as member:
            got = await fetch_n(member, 5)
            assert {d.position.log for d in got if d.position is not None} == {log}
            await tell_first_deliveries(got, store.claim_positions)
            assert counts(got) == dict.fromkeys(range(5), None)
            await member.ack(got)
    finally:
        await store.close()
