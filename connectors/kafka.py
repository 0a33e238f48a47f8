"""Kafka consuming: one topic per model and lane, keyed by request ID, one consumer group.

Publishing and topic creation are in ``connectors.kafka_publisher``.

Why it looks the way it does:

* Offsets, not per-message acks. A worker finishes batches out of order, but
  Kafka can only store "everything before offset N is done" per partition. So
  each partition tracks its in-flight offsets and commits up to the lowest one
  still in flight; finished work above a gap is redelivered after a crash and
  the result store (first terminal result wins) makes that harmless.
* Rebalances. Before partitions move away the contiguous finished prefix is
  committed, then their tracking is dropped; a late ack for a partition this
  consumer no longer owns is ignored, because its new owner redelivers it.
* Lag comes from the highwater each fetch response carries (Tansu's
  ``end_offsets`` can be low); ``end_offsets`` is only asked where that is
  missing or stale (never fetched yet, or paused).
* Pausing is per model (its breaker opened): only that model's partitions are
  paused. While every one is paused, the worker keeps calling ``fetch`` all the same
  (``Worker._poll_paused``): a member that stops polling for ``max_poll_interval_ms``
  (5 min) is dropped from the group.
* Lost logs (``connectors.kafka_loss``): a partition whose log went back (a broker
  restarted empty, a truncation, a recreated topic) starts a new epoch, part of each
  delivery token, so old acks never commit into the new log; its lane's loss is noted
  in :attr:`KafkaConsumer.lane_losses` for the heartbeat to record, as on Redis, and a
  topic gone from the broker is created again (``connectors.kafka_topics``, a background
  task: whole-cluster metadata is never read inside ``fetch``).
* Skipped offsets (``connectors.kafka_gaps``): a fetch whose offsets jump forward has
  left records out (our topics are contiguous); the hole is read again, not passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
)
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from batchfleet.connectors.broker import Delivery, LaneBacklog
from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.kafka_gaps import GapWatch
from batchfleet.connectors.kafka_loss import LossWatch
from batchfleet.connectors.kafka_publisher import ensure_topics
from batchfleet.connectors.kafka_topics import TOPIC_CHECK_S, TopicWatch, seek_to_start
from batchfleet.connectors.values import LogPosition
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import LANE_INTERACTIVE, LANES, Names

log = structlog.get_logger("batchfleet.kafka")
__all__ = ["TOPIC_CHECK_S", "KafkaConsumer"]


@dataclass(slots=True)
class _Partition:
    """What one assigned partition has handed out and what has been committed."""

    in_flight: set[int] = field(default_factory=set)
    next_offset: int | None = None  # one past the highest offset fetched
    committed: int | None = None  # last commit made, or the first offset fetched

    def done_offset(self) -> int | None:
        """Everything below is finished: the lowest offset in flight, else the next one."""
        return min(self.in_flight) if self.in_flight else self.next_offset

    def commit_target(self) -> int | None:
        """The offset to commit now, or None when it would not advance."""
        target = self.done_offset()
        if target is None or (self.committed is not None and target <= self.committed):
            return None
        return target


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: KafkaConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._owner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._owner._on_assigned(assigned)


class KafkaConsumer:
    """A member of the consumer group that commits per partition below the lowest in-flight."""

    def __init__(
        self,
        bootstrap: str,
        names: Names,
        consumer_name: str,
        partitions: int = 4,
        *,
        group: str | None = None,
        replication_factor: int = 1,
        session_timeout_ms: int = 10_000,
        fetch_max_wait_ms: int = 50,
        commit_timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._names = names
        self._group = group or names.consumer_group
        self._topic_spec = (partitions, replication_factor)
        self._commit_timeout_s = commit_timeout_s
        self._start_timeout_s = start_timeout_s
        self._options: dict[str, Any] = dict(
            bootstrap_servers=bootstrap, group_id=self._group, client_id=consumer_name,
            enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(100, session_timeout_ms // 3),
            # Tansu answers a fetch only when this expires, so it bounds idle latency.
            fetch_max_wait_ms=fetch_max_wait_ms,
        )
        self._consumer: Any = None
        self._topics: dict[str, tuple[str, str]] = {}
        self._parts: dict[TopicPartition, _Partition] = {}
        self._interactive: list[TopicPartition] = []
        #: Models whose partitions are paused, now and after any rebalance.
        self._paused: set[str] = set()
        self._commit_lock = asyncio.Lock()
        self._watch = LossWatch(self._group)
        self._gaps = GapWatch()
        #: Lanes whose log was lost, not yet recorded (the worker's heartbeat drains it).
        self.lane_losses = self._watch.lane_losses
        self._owned: set[TopicPartition] = set()  # the last assignment
        self._unchecked: set[TopicPartition] = set()
        self._topic_watch: TopicWatch | None = None
        self._topic_task: asyncio.Task[None] | None = None

    async def start(self, models: Sequence[str]) -> None:
        """Create every lane's topic, join the group and return once partitions are assigned."""
        self._topics = {self._names.topic(m, lane): (m, lane) for m in models for lane in LANES}
        await ensure_topics(self._bootstrap, self._topics, *self._topic_spec)
        consumer = AIOKafkaConsumer(**self._options)
        consumer.subscribe(topics=list(self._topics), listener=_Rebalance(self))
        self._consumer = consumer  # the listener runs inside start()
        try:
            await bounded(consumer.start(), self._start_timeout_s)
        except (KafkaError, TimeoutError) as exc:
            self._consumer = None
            await consumer.stop()
            raise TransportError(
                f"cannot join Kafka group {self._group!r} at {self._bootstrap}: {exc!r}"
            ) from exc
        self._topic_watch = TopicWatch(self._bootstrap, self._topics, self._topic_spec)
        self._topic_task = asyncio.create_task(self._topic_watch.run(consumer.topics),
                                               name="kafka-topic-watch")

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        """Partitions this member owns right now (empty before start or mid-rebalance)."""
        return frozenset(self._consumer.assignment()) if self._consumer is not None else frozenset()

    def _require(self) -> Any:
        if self._consumer is None:
            raise TransportError("KafkaConsumer used before start() or after close()")
        return self._consumer

    async def fetch(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Interactive partitions first, then anything; ``[]`` after ``timeout_s`` if idle.

        While paused the broker is still polled (so the group sees this member as
        alive) but paused partitions return nothing.
        """
        out: list[Delivery] = []
        if max_count < 1:
            return out
        if self._topic_watch is not None and (gone := self._topic_watch.take()):
            await self._topics_lost(gone)
        if interactive := [tp for tp in self._interactive if not self._is_paused(tp)]:
            out = self._deliveries(await self._getmany(interactive, max_count, 0.0))
        if len(out) < max_count:
            wait_s = 0.0 if out else timeout_s
            out.extend(self._deliveries(await self._getmany((), max_count - len(out), wait_s)))
            out.sort(key=lambda d: LANES.index(d.lane))
        await self._check_ends()
        return out

    async def _check_ends(self) -> None:
        """Lost: a log end (the last fetch's highwater) below an offset already fetched, or
        a newly assigned partition whose committed offset is past its log end."""
        consumer = self._require()
        self._watch.date_the_rest()
        lost = [tp for tp in consumer.assignment()
                if self._watch.end_went_back(tp, consumer.highwater(tp))]
        for tp in [tp for tp in self._unchecked if consumer.highwater(tp) is not None]:
            self._unchecked.discard(tp)
            try:
                if await consumer.position(tp) > consumer.highwater(tp):
                    lost.append(tp)
            except IllegalStateError:
                pass  # no longer ours
        for tp in lost:
            self._watch.lost(tp, self._topics[tp.topic], None)
            self._parts[tp] = _Partition()
            self._gaps.forget(tp)
        if lost:
            self._watch.warn((":".join(self._topics[tp.topic]) for tp in lost),
                             "log end went back")
            await seek_to_start(consumer, lost)

    async def _topics_lost(self, gone: set[str]) -> None:
        """Topics the watch created again: count their lanes lost, read their new logs."""
        lanes = [self._topics[t] for t in gone]
        self._watch.topic_lost((tp for tp in self._watch.known() if tp.topic in gone), lanes)
        for tp in (mine := [tp for tp in self._parts if tp.topic in gone]):
            self._parts[tp] = _Partition()
            self._gaps.forget(tp)
        if mine:
            await seek_to_start(self._require(), mine)
        self._watch.warn((":".join(lane) for lane in lanes), "topic gone; created again")

    async def _getmany(
        self, tps: Sequence[TopicPartition], max_records: int, wait_s: float
    ) -> dict[TopicPartition, list[Any]]:
        consumer = self._require()
        call = consumer.getmany(*tps, timeout_ms=int(wait_s * 1000), max_records=max_records)
        try:
            # getmany waits for a rebalance in progress without a bound; this keeps ours.
            result: dict[TopicPartition, list[Any]] = await bounded(call, wait_s + 0.05)
        except TimeoutError:
            return {}
        except KafkaError as exc:
            raise TransportError(f"Kafka fetch failed: {exc!r}") from exc
        return result

    def _deliveries(self, batches: dict[TopicPartition, list[Any]]) -> list[Delivery]:
        """Track what was handed out; tokens are ``(partition, offset, epoch)``."""
        out: list[Delivery] = []
        lost: list[str] = []
        for tp, records in batches.items():
            if not records:
                continue
            model, lane = self._topics[tp.topic]
            part = self._parts.setdefault(tp, _Partition())
            keep, read_again = self._gaps.check(tp, [r.offset for r in records],
                                                part.next_offset, time.monotonic())
            if read_again is not None:  # offsets skipped forward: connectors/kafka_gaps.py
                try:
                    self._require().seek(tp, read_again)
                except IllegalStateError:
                    continue  # no longer ours: its new owner reads from the last commit
                if not (records := records[:keep]):
                    continue
            if self._watch.fetched(tp, records, first_in_assignment=part.committed is None,
                                   next_offset=part.next_offset):
                self._watch.lost(tp, (model, lane), records)
                part = self._parts[tp] = _Partition()
                lost.append(f"{model}:{lane}")
            if part.committed is None:
                part.committed = records[0].offset  # where the group's offset already is
                self._watch.dated(tp, records)
            epoch = self._watch.epoch(tp)
            log_name = f"{self._group}/{tp.topic}/{tp.partition}"
            for rec in records:
                part.in_flight.add(rec.offset)
                # Kafka's own "no timestamp" is -1, LogPosition's too
                out.append(Delivery(model, lane, rec.value or b"", (tp, rec.offset, epoch),
                                    position=LogPosition(log_name, rec.offset, rec.timestamp)))
            part.next_offset = records[-1].offset + 1
            self._watch.note_fetched(tp, part.next_offset)
        if lost:
            self._watch.warn(lost, "fetch position went back")
        return out

    async def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Mark deliveries done and commit each touched partition up to its lowest in flight.

        Deliveries from partitions this consumer no longer owns are ignored.
        """
        touched: set[TopicPartition] = set()
        for d in deliveries:
            tp, offset, epoch = d.token
            part = self._parts.get(tp)
            if part is not None and epoch == self._watch.epoch(tp):  # not from a lost log
                part.in_flight.discard(offset)
                touched.add(tp)
        if touched:
            await self._commit(touched)

    async def _commit(self, tps: Iterable[TopicPartition]) -> None:
        """One commit call for every partition whose done prefix advanced."""
        consumer = self._require()
        async with self._commit_lock:
            assigned = consumer.assignment()
            targets = {
                tp: target
                for tp in tps
                if tp in assigned
                and (part := self._parts.get(tp)) is not None
                and (target := part.commit_target()) is not None
            }
            if not targets:
                return
            offsets = {tp: OffsetAndMetadata(off, "") for tp, off in targets.items()}
            epochs = {tp: self._watch.epoch(tp) for tp in targets}
            try:
                await bounded(consumer.commit(offsets), self._commit_timeout_s)
            except (CommitFailedError, IllegalStateError) as exc:
                # The group rebalanced under us: the new owner redelivers from the last
                # commit, and the result store makes the repeats harmless.
                log.warning("kafka_commit_skipped_rebalance", group=self._group, error=str(exc))
                return
            except TimeoutError as exc:
                raise TransportError(
                    f"Kafka offset commit did not finish in {self._commit_timeout_s}s"
                ) from exc
            except KafkaError as exc:
                raise TransportError(f"Kafka offset commit failed: {exc!r}") from exc
            for tp, off in targets.items():
                self._watch.note_committed(tp, off, epochs[tp])
                part = self._parts.get(tp)
                if part is not None and epochs[tp] == self._watch.epoch(tp):
                    part.committed = off

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        try:
            if done := [tp for tp in revoked if tp in self._parts]:
                await self._commit(done)
        except TransportError as exc:
            log.warning("kafka_commit_on_revoke_failed", group=self._group, error=str(exc))
        finally:
            for tp in revoked:
                self._parts.pop(tp, None)
            self._interactive = []

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        # What was seen of a partition someone else owned since is stale: forget it.
        self._watch.forget(assigned - self._owned)
        self._owned = set(assigned)
        #: Positions not yet compared with the log end (once per assignment).
        self._unchecked = set(assigned)
        self._parts = {tp: _Partition() for tp in assigned}
        for tp in assigned:
            self._gaps.forget(tp)
        self._interactive = sorted(
            (tp for tp in assigned if self._topics.get(tp.topic, ("", ""))[1] == LANE_INTERACTIVE),
            key=lambda tp: (tp.topic, tp.partition),
        )
        paused = [tp for tp in assigned if self._is_paused(tp)]
        if paused and self._consumer is not None:
            self._consumer.pause(*paused)

    def _is_paused(self, tp: TopicPartition) -> bool:
        # a version lane ("m@v2") pauses with its model
        return self._topics.get(tp.topic, ("", ""))[0].partition("@")[0] in self._paused

    async def pause(self, models: Sequence[str] | None = None) -> None:
        """Stop fetching these models' partitions (all when None), now and after
        rebalances, but stay in the group."""
        self._paused.update(models if models is not None else
                            {m for m, _ in self._topics.values()})
        if self._consumer is not None and (
                tps := [tp for tp in self._consumer.assignment() if self._is_paused(tp)]):
            self._consumer.pause(*tps)

    async def resume(self, models: Sequence[str] | None = None) -> None:
        """Fetch these models' partitions (all when None) again."""
        if self._consumer is not None:
            tps = [tp for tp in self._consumer.assignment() if self._is_paused(tp) and (
                models is None or self._topics[tp.topic][0].partition("@")[0] in models)]
            if tps:
                self._consumer.resume(*tps)
        if models is None:
            self._paused.clear()
        else:
            self._paused.difference_update(models)

    async def keep_alive(self, deliveries: Sequence[Delivery]) -> None:
        """Nothing to do: a partition is ours until a rebalance, however long we hold it."""

    async def backlog(self) -> list[LaneBacklog]:
        """Unfinished messages per lane: end of log minus the lowest offset not yet acked.

        The end is the highwater the last fetch saw; ``end_offsets`` is asked only
        where that is missing or stale (never fetched, or paused). A consumer only
        sees its *assigned* partitions, so with several workers each reports its
        own share; the fleet's lag is the group's (what KEDA's Kafka scaler reads).
        """
        consumer = self._require()
        highwater = {tp: consumer.highwater(tp) for tp in consumer.assignment()}
        depth = dict.fromkeys(self._topics.values(), 0)
        try:
            stale = [tp for tp, hw in highwater.items() if hw is None or self._is_paused(tp)]
            ends = await consumer.end_offsets(stale) if stale else {}
            for tp, hw in highwater.items():
                part = self._parts.get(tp)
                done = part.done_offset() if part is not None else None
                if done is None:
                    done = await consumer.position(tp)
                depth[self._topics[tp.topic]] += max(0, max(hw or 0, ends.get(tp, 0)) - done)
        except IllegalStateError:
            pass  # a rebalance took partitions away mid-count: report what was counted
        except KafkaError as exc:
            raise TransportError(f"Kafka lag lookup failed: {exc!r}") from exc
        return [LaneBacklog(m, lane, n) for (m, lane), n in depth.items()]

    async def close(self) -> None:
        """Leave the group. Acks already committed; un-acked work goes to the next owner."""
        task, self._topic_task = self._topic_task, None
        if task is not None:
            await cancel_until_done([task])  # its cancellation is not ours to raise
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            _leave_group_at_generation_zero(consumer)
            await consumer.stop()
        self._parts.clear()


def _leave_group_at_generation_zero(consumer: Any) -> None:
    """Make ``stop()`` send LeaveGroup even when the group's generation is 0.

    aiokafka only leaves for generation > 0, but "no generation" is -1 and Tansu
    numbers a group's first generation 0 (Kafka starts at 1). Without this, the
    first member of a group never leaves cleanly and the next member's join waits
    out the whole session timeout. A no-op on Kafka, or if aiokafka's internals move.
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)
    leave = getattr(coordinator, "_maybe_leave_group", None)
    if leave is None or getattr(coordinator, "generation", None) != 0:
        return

    async def leave_even_at_zero() -> None:
        if coordinator.generation == 0 and coordinator.member_id:
            coordinator.generation = 1  # LeaveGroup itself carries no generation
        await leave()

    coordinator._maybe_leave_group = leave_even_at_zero
