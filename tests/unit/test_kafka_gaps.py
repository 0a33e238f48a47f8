"""A Kafka fetch whose offsets skip forward is read again before the consumer moves past
the hole (``connectors/kafka_gaps.py``); only a hole that stays is accepted, and said."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from batchfleet.connectors.kafka_gaps import GAP_PATIENCE_S, GapWatch, first_gap

pytestmark = pytest.mark.unit

TP = ("bf.m.batch", 2)


def test_first_gap_finds_the_first_offset_out_of_step() -> None:
    assert first_gap([5, 6, 7], 5) is None
    assert first_gap([], 5) is None
    assert first_gap([7, 8], 5) == 0  # the fetch itself starts past the next offset
    assert first_gap([5, 6, 9, 10], 5) == 2  # a hole inside one fetch
    assert first_gap([5, 4], 5) == 1  # out of order counts as a hole too


def test_contiguous_records_are_handed_out_whole_and_nothing_is_read_again() -> None:
    gaps = GapWatch()
    assert gaps.check(TP, [100, 101, 102], 100, now=0.0) == (3, None)
    assert gaps.check(TP, [103], 103, now=0.1) == (1, None)
    assert gaps.found == 0


def test_a_fetch_past_the_next_offset_hands_out_nothing_and_reads_the_hole_again() -> None:
    """The defect seen over Tansu: offsets 13852-13857 left out, 13858 on returned."""
    gaps = GapWatch()
    with capture_logs() as logs:
        assert gaps.check(TP, [13858, 13859], 13852, now=0.0) == (0, 13852)
    assert [entry["event"] for entry in logs] == ["kafka_offsets_skipped_reading_again"]
    assert logs[0]["expected"] == 13852 and logs[0]["received"] == 13858
    # read again, the hole is there now: handed out, and the gap closed
    assert gaps.check(TP, [13852, 13853, 13854], 13852, now=0.2) == (3, None)
    assert gaps.check(TP, [13855], 13855, now=0.3) == (1, None)
    assert (gaps.found, gaps.accepted) == (1, 0)


def test_a_hole_inside_one_fetch_hands_out_what_comes_before_it() -> None:
    gaps = GapWatch()
    assert gaps.check(TP, [10, 11, 15, 16], 10, now=0.0) == (2, 12)


def test_a_hole_that_stays_is_accepted_after_the_patience_with_a_warning() -> None:
    gaps = GapWatch(patience_s=GAP_PATIENCE_S)
    assert gaps.check(TP, [20, 21], 12, now=0.0) == (0, 12)
    with capture_logs() as logs:
        # the same hole again and again, within the patience: one warning, not one a fetch
        assert gaps.check(TP, [20, 21], 12, now=GAP_PATIENCE_S / 2) == (0, 12)
        assert logs == []
        assert gaps.check(TP, [20, 21], 12, now=GAP_PATIENCE_S) == (2, None)
    assert [entry["event"] for entry in logs] == ["kafka_offsets_skipped_accepted"]
    assert (gaps.found, gaps.accepted) == (1, 1)


def test_a_first_fetch_or_one_that_goes_back_is_checked_only_within_itself() -> None:
    """No next offset yet (a new assignment, or after a loss), or offsets that go back
    (the loss watch's business): only a hole inside the fetch counts."""
    gaps = GapWatch()
    assert gaps.check(TP, [40, 41], None, now=0.0) == (2, None)
    assert gaps.check(TP, [3, 4, 5], 42, now=0.0) == (3, None)
    assert gaps.check(TP, [3, 5], 42, now=0.0) == (1, 4)


def test_a_forgotten_partition_starts_its_patience_again() -> None:
    gaps = GapWatch(patience_s=1.0)
    assert gaps.check(TP, [9], 7, now=0.0) == (0, 7)
    gaps.forget(TP)
    assert gaps.check(TP, [9], 7, now=5.0) == (0, 7)  # a new hole, not one waited 5 s
    assert gaps.found == 2
