"""LossWatch decides from offsets alone when a Kafka partition's log was lost (pure logic;
the end-to-end proof with a real broker is tests/e2e/test_kafka_lane_loss.py)."""

from __future__ import annotations

import msgpack
from aiokafka.structs import ConsumerRecord, TopicPartition

from batchfleet.connectors.kafka_loss import LossWatch, loss_moment

TP = TopicPartition("bf.requests.m.interactive", 0)


def _rec(offset: int, timestamp_ms: int, enqueued_s: float | None = None) -> ConsumerRecord:
    body = msgpack.packb({"id": f"r{offset}", "enqueued_at": enqueued_s}
                         if enqueued_s is not None else {"id": f"r{offset}"})
    return ConsumerRecord(TP.topic, TP.partition, offset, timestamp_ms, 0, b"k", body, None,
                          1, len(body), [])


def test_offsets_that_go_back_are_a_loss_and_forward_ones_are_not() -> None:
    watch = LossWatch("g")
    watch.note_fetched(TP, 500)
    watch.note_committed(TP, 400, watch.epoch(TP))
    # the same assignment: on past what was fetched is fine, back below it is a loss
    assert not watch.fetched(TP, [_rec(500, 0)], first_in_assignment=False, next_offset=500)
    assert watch.fetched(TP, [_rec(0, 0)], first_in_assignment=False, next_offset=500)
    # a new assignment may start below what this process fetched (others had not committed
    # it), but never below what it committed
    assert not watch.fetched(TP, [_rec(450, 0)], first_in_assignment=True, next_offset=None)
    assert watch.fetched(TP, [_rec(10, 0)], first_in_assignment=True, next_offset=None)
    assert not watch.end_went_back(TP, 500) and watch.end_went_back(TP, 20)
    assert not watch.end_went_back(TP, None)


def test_an_end_that_stands_below_fetched_records_is_not_a_loss_each_time() -> None:
    """Tansu after a restart under load handed out offsets 0-15 while reporting an end of
    11, fetch after fetch: only an end that moves back is a loss, else each fetch would
    start a new epoch and read the same first records again for ever."""
    watch = LossWatch("g")
    watch.note_fetched(TP, 150)
    assert not watch.end_went_back(TP, 150)
    assert watch.end_went_back(TP, 11)  # the restart: the end moved back
    watch.lost(TP, ("m", "interactive"), None)
    watch.note_fetched(TP, 16)  # the new log, read from its start, past its stated end
    assert not watch.end_went_back(TP, 11)
    watch.note_fetched(TP, 24)
    assert not watch.end_went_back(TP, 11) and not watch.end_went_back(TP, 19)
    assert watch.end_went_back(TP, 3)  # lost again: the end moved back below 19


def test_a_loss_starts_a_new_epoch_forgets_the_old_log_and_notes_the_lane() -> None:
    watch = LossWatch("g")
    watch.note_fetched(TP, 500)
    watch.note_committed(TP, 500, 0)
    watch.lost(TP, ("m", "interactive"), [_rec(0, 1_000_000, 1000.0)])
    assert watch.epoch(TP) == 1 and watch.losses == 1
    assert watch.lane_losses == {"m:interactive": 1_000_000}
    assert not watch.end_went_back(TP, 3)  # the new log is judged on its own
    watch.note_committed(TP, 900, 0)  # a commit from the lost log is not remembered
    assert not watch.fetched(TP, [_rec(5, 0)], first_in_assignment=True, next_offset=None)


def test_the_loss_moment_is_the_new_logs_first_fresh_request_else_now() -> None:
    fresh = [_rec(0, 5_000, 5.0), _rec(1, 5_100, 4.9)]
    assert loss_moment(fresh, now_ms=9_000) == 4_900
    retried = [_rec(0, 5_000, 1.0)]  # republished long after it was enqueued: not counted
    assert loss_moment(retried, now_ms=9_000) == 5_000
    assert loss_moment([_rec(7, 5_000, 5.0)], now_ms=9_000) == 9_000  # mid-log: now
    assert loss_moment([], now_ms=9_000) == 9_000


def test_a_loss_seen_without_records_is_dated_by_the_new_logs_first_records() -> None:
    watch = LossWatch("g")
    watch.note_fetched(TP, 300)
    watch.lost(TP, ("m", "bulk"), None)  # the log end went back: nothing fetched yet
    assert watch.lane_losses == {} and watch.epoch(TP) == 1
    watch.dated(TP, [_rec(0, 5_000, 5.0)])  # published after the loss: not reported lost
    assert watch.lane_losses == {"m:bulk": 5_000}
    watch.dated(TP, [_rec(0, 9_000, 9.0)])  # dated once
    assert watch.lane_losses == {"m:bulk": 5_000}


def test_what_was_seen_of_a_partition_another_member_owned_since_is_forgotten() -> None:
    watch = LossWatch("g")
    watch.note_fetched(TP, 300)
    watch.note_committed(TP, 300, 0)
    watch.forget([TP])
    assert not watch.end_went_back(TP, 10)
    assert not watch.fetched(TP, [_rec(10, 0)], first_in_assignment=True, next_offset=None)
