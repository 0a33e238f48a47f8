"""Kafka lane-loss detection: noticing that a partition's log lost records it had.

On a healthy cluster a partition's log end never moves back, and the group's
committed offset only moves forward. Both break when the log is lost: a broker
restarted empty (Tansu's memory storage, a single-replica broker that lost its
disk), an unclean leader election truncating the log, a topic deleted and
recreated. Requests queued there are gone, and their waiters would hang, so per
partition this process remembers one past the highest offset it fetched and the
highest offset it committed (kept while it keeps the partition across a rebalance,
forgotten once another member had it), and calls the log lost when:

* a fetch response's highwater is below an offset this process fetched and below
  the highest highwater it saw (a broker may report an end below records it hands
  out; only an end that moves back counts);
* a fetch hands back an offset below one already fetched in the same assignment
  (aiokafka reset the position after ``OffsetOutOfRange``);
* the first fetch of an assignment starts below an offset this process committed
  (the group's committed offsets were lost);
* a topic this consumer saw is missing from the cluster's metadata.

A loss bumps the partition's *epoch* (part of every delivery token, so acks and
leases of the old log's offsets never touch the new log's) and notes the moment
in :attr:`LossWatch.lane_losses` (``{model}:{lane}`` -> epoch ms), which the
worker's heartbeat writes to the result store exactly as for Redis Streams
(``Names.lane_loss``); waiters of requests enqueued before it then end with
``RequestLostError``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import structlog
from aiokafka.structs import TopicPartition

from batchfleet.schemas.envelopes import peek_header
from batchfleet.schemas.names import lane_loss_field

log = structlog.get_logger("batchfleet.kafka")

#: A record whose broker timestamp is within this of its ``enqueued_at`` was published
#: at submit (a retry republished later keeps its old ``enqueued_at`` and must not count).
LOSS_MARGIN_MS = 1000
#: How long a loss seen without records waits for the new log's first records to date it.
UNDATED_WAIT_S = 1.0
#: A lane's loss is logged once in this long, however many partitions notice it.
_WARN_EVERY_S = 60.0


def loss_moment(records: Sequence[Any], now_ms: int) -> int:
    """Epoch ms before which requests on a lost partition are gone.

    When the fetch that noticed the loss starts the new log (offset 0: restarted
    empty, or recreated), its first records were published after the loss: the
    earliest of their ``enqueued_at`` is the moment, so those survivors are not
    reported lost. Otherwise (a truncated log, nothing fetched yet) it is now.
    """
    if not records or records[0].offset != 0:
        return now_ms
    fresh = []
    for rec in records[:100]:
        enqueued = peek_header(rec.value or b"").get("enqueued_at")
        if (isinstance(enqueued, float | int)
                and abs(int(rec.timestamp) - enqueued * 1000) <= LOSS_MARGIN_MS):
            fresh.append(int(enqueued * 1000))
    return min(now_ms, *fresh) if fresh else min(now_ms, int(records[0].timestamp))


class LossWatch:
    """What this consumer has seen of each partition's log, and the losses it noticed."""

    def __init__(self, group: str) -> None:
        self._group = group
        self._fetched: dict[TopicPartition, int] = {}  # one past the highest fetched
        self._ends: dict[TopicPartition, int] = {}  # the highest log end seen
        self._committed: dict[TopicPartition, int] = {}  # highest committed by this process
        self._epochs: dict[TopicPartition, int] = {}
        self._warned: dict[str, float] = {}
        #: Losses seen without records: (lane, epoch ms seen, monotonic deadline to date it).
        self._undated: dict[TopicPartition, tuple[tuple[str, str], int, float]] = {}
        #: ``{model}:{lane}`` -> epoch ms of losses not yet recorded in the store (the
        #: worker's heartbeat drains it, as for Redis Streams).
        self.lane_losses: dict[str, int] = {}
        #: Losses noticed since start (counted once per partition and loss).
        self.losses = 0

    def epoch(self, tp: TopicPartition) -> int:
        return self._epochs.get(tp, 0)

    def fetched(self, tp: TopicPartition, records: Sequence[Any], *, first_in_assignment: bool,
                next_offset: int | None) -> bool:
        """Check a fetch's records for ``tp`` against what was seen; True when the log was
        lost (the caller then starts the partition's tracking afresh)."""
        first = records[0].offset
        went_back = next_offset is not None and first < next_offset
        below_commit = first_in_assignment and first < self._committed.get(tp, 0)
        return went_back or below_commit

    def note_fetched(self, tp: TopicPartition, next_offset: int) -> None:
        self._fetched[tp] = max(next_offset, self._fetched.get(tp, 0))

    def note_committed(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """A commit made in ``epoch`` landed; one from a log since lost is not remembered."""
        if epoch == self.epoch(tp):
            self._committed[tp] = max(offset, self._committed.get(tp, 0))

    def end_went_back(self, tp: TopicPartition, highwater: int | None) -> bool:
        """The log end moved back: below the highest end seen in this epoch and below an
        offset fetched. Below a fetched offset alone is not enough: a broker that lost
        its log can hand out records past the end it reports, with that end standing
        still (Tansu after a restart, under load), and calling each fetch a new loss
        read the first records again for ever, never those after them."""
        if highwater is None:
            return False
        seen = self._ends.get(tp)
        self._ends[tp] = highwater if seen is None else max(seen, highwater)
        return seen is not None and highwater < seen and highwater < self._fetched.get(tp, 0)

    def lost(self, tp: TopicPartition, lane: tuple[str, str], records: Sequence[Any] | None
             ) -> None:
        """Forget what was seen of ``tp``'s log, start a new epoch and note the lane's loss.

        ``records``: the fetch that showed the loss, whose first records date it; None
        when no records came with it (the log end went back): the moment waits for the
        new log's first records (the caller reads it from its start), see :meth:`dated`.
        """
        self._fetched.pop(tp, None)
        self._ends.pop(tp, None)
        self._committed.pop(tp, None)
        self._epochs[tp] = self.epoch(tp) + 1
        self.losses += 1
        now_ms = int(time.time() * 1000)
        if records is None:
            self._undated[tp] = (lane, now_ms, time.monotonic() + UNDATED_WAIT_S)
        else:
            self._note(tp, lane, loss_moment(records, now_ms))

    def dated(self, tp: TopicPartition, records: Sequence[Any]) -> None:
        """The first records fetched since an undated loss of ``tp`` date it."""
        if (undated := self._undated.pop(tp, None)) is not None:
            lane, now_ms, _ = undated
            self._note(tp, lane, loss_moment(records, now_ms))

    def date_the_rest(self) -> None:
        """Undated losses whose new log stayed empty: dated when they were seen."""
        now = time.monotonic()
        for tp in [tp for tp, (_, _, by) in self._undated.items() if now >= by]:
            lane, now_ms, _ = self._undated.pop(tp)
            self._note(tp, lane, now_ms)

    def _note(self, tp: TopicPartition, lane: tuple[str, str], moment: int) -> None:
        key = lane_loss_field(*lane)
        self.lane_losses[key] = max(moment, self.lane_losses.get(key, 0))
        log.info("kafka_partition_log_lost", topic=tp.topic, partition=tp.partition,
                 lost_before_ms=moment, epoch=self.epoch(tp))

    def topic_lost(self, tps: Iterable[TopicPartition], lanes: Iterable[tuple[str, str]]) -> None:
        """A topic vanished: every partition of it this process saw starts a new epoch."""
        for tp in list(tps):
            self._fetched.pop(tp, None)
            self._ends.pop(tp, None)
            self._committed.pop(tp, None)
            self._epochs[tp] = self.epoch(tp) + 1
        now_ms = int(time.time() * 1000)
        log.info("kafka_topics_lost", lanes=[lane_loss_field(*lane) for lane in lanes],
                 lost_before_ms=now_ms)
        for lane in lanes:
            self.losses += 1
            key = lane_loss_field(*lane)
            self.lane_losses[key] = max(now_ms, self.lane_losses.get(key, 0))

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions others owned since this process saw them: what it saw is stale."""
        for tp in tps:
            self._fetched.pop(tp, None)
            self._ends.pop(tp, None)
            self._committed.pop(tp, None)

    def known(self) -> list[TopicPartition]:
        return list(self._fetched)

    def warn(self, lanes: Iterable[str], how: str) -> None:
        """One warning per lost lane (per ``_WARN_EVERY_S``), not one per partition."""
        now = time.monotonic()
        fresh = sorted(k for k in set(lanes) if now - self._warned.get(k, -_WARN_EVERY_S)
                       >= _WARN_EVERY_S)
        if fresh:
            self._warned.update(dict.fromkeys(fresh, now))
            log.warning("Kafka lane lost its log (broker restarted empty, log truncated, "
                        "topic recreated or offsets reset): requests queued there before "
                        "now are lost and their waiters told so", lanes=fresh, how=how,
                        group=self._group)
