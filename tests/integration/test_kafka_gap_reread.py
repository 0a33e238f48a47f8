"""Against a real Kafka-protocol broker: a fetch that jumps forward past records the
consumer never handed out is read again, so every record reaches a worker exactly once
(``connectors/kafka_gaps.py``; the request-no-worker-answers defect of docs/performance.md).

The jump is made the way it was seen: aiokafka's position moved past records that
are in the log. Here the test moves it (a seek behind our consumer's back) instead of
waiting for the broker to leave a batch out of a fetch, which it did about once in a
million requests.
"""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka.structs import TopicPartition

from batchfleet.connectors.broker import Delivery, OutboundMessage
from batchfleet.connectors.kafka import KafkaConsumer
from batchfleet.connectors.kafka_publisher import KafkaPublisher
from batchfleet.schemas.names import LANE_BULK, Names

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.timeout(60)]

MODEL = "m"


async def test_a_fetch_that_skips_offsets_forward_reads_them_again_and_loses_none(
        kafka_broker: str) -> None:
    names = Names(prefix=f"t{uuid.uuid4().hex[:10]}")
    keys = [f"k{i:03d}" for i in range(60)]
    pub = KafkaPublisher(kafka_broker, names, 1)
    try:
        await pub.publish([OutboundMessage(MODEL, LANE_BULK, k, k.encode()) for k in keys])
    finally:
        await pub.close()
    c = KafkaConsumer(kafka_broker, names, "c-gap", 1, group=f"g-{uuid.uuid4().hex[:8]}",
                      session_timeout_ms=6000)
    await c.start([MODEL])
    try:
        got: list[Delivery] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += await c.fetch(10 - len(got), 0.5)
        assert [d.payload for d in got] == [k.encode() for k in keys[:10]]
        tp = TopicPartition(names.topic(MODEL, LANE_BULK), 0)
        assert c._consumer is not None
        c._consumer.seek(tp, 16)  # offsets 10-15 skipped, as the broker once did
        while len(got) < len(keys) and time.monotonic() < deadline:
            got += await c.fetch(len(keys) - len(got), 0.5)
        payloads = [d.payload for d in got]
        assert payloads == [k.encode() for k in keys]  # each once, and in order
        assert (c._gaps.found, c._gaps.accepted) == (1, 0)
        assert not c.lane_losses  # reading the hole again is not a lost log
        await c.ack(got)
    finally:
        await c.close()
