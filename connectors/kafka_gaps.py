"""Offsets that skip forward in a Kafka partition: read the gap again before moving past it.

Our topics have no compaction and no transactions, so a partition's offsets are
contiguous and a fetch that jumps forward (records from 13858 when 13852 was next) has
left records out. aiokafka accepts such a jump without a word (it only drops records
*below* the fetch position, as compacted topics need) and moves its position past the
hole, so those requests would never reach a worker while everything after them did: a
request no worker answers. That was seen over Tansu with two producers writing one
partition at once (six consecutive offsets, one producer's batch, still in the log when
read later), which fits a batch that becomes readable after a later one.

So a gap is read again: the records before it are handed out, the position is moved
back to it, and the next fetches try again. A gap that stays longer than
:data:`GAP_PATIENCE_S` is accepted with a warning (records truly gone: a truncated log
the loss watch did not see). Offsets that go *back* are the loss watch's
(``connectors/kafka_loss.py``), not this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("batchfleet.kafka")

#: How long a gap is read again before the records after it are handed out anyway.
GAP_PATIENCE_S = 5.0


def first_gap(offsets: Sequence[int], expected: int) -> int | None:
    """Index of the first offset that is not ``expected`` plus its index, else None."""
    for i, offset in enumerate(offsets):
        if offset != expected + i:
            return i
    return None


@dataclass
class GapWatch:
    """Per partition: the gap being read again, and since when."""

    patience_s: float = GAP_PATIENCE_S
    _open: dict[Any, tuple[int, float]] = field(default_factory=dict)
    #: Gaps found, and gaps accepted after the patience ran out (for tests and logs).
    found: int = 0
    accepted: int = 0

    def check(self, tp: Any, offsets: Sequence[int], expected: int | None, now: float
              ) -> tuple[int, int | None]:
        """How many of these records to hand out, and where to move the position (or None).

        ``expected`` is one past the highest offset handed out before (None on a
        partition's first fetch, or after a loss: then the batch itself is checked).
        """
        if expected is None or not offsets or offsets[0] < expected:
            expected = offsets[0] if offsets else 0
        at = first_gap(offsets, expected)
        if at is None:
            self._open.pop(tp, None)
            return len(offsets), None
        gap = expected + at
        opened = self._open.get(tp)
        if opened is None or opened[0] != gap:
            self._open[tp] = opened = (gap, now)
            self.found += 1
            log.warning("kafka_offsets_skipped_reading_again", partition=str(tp),
                        expected=gap, received=offsets[at])
        if now - opened[1] >= self.patience_s:
            self._open.pop(tp, None)
            self.accepted += 1
            log.warning("kafka_offsets_skipped_accepted", partition=str(tp), expected=gap,
                        received=offsets[at], waited_s=round(now - opened[1], 1))
            return len(offsets), None
        return at, gap

    def forget(self, tp: Any) -> None:
        """A partition read from elsewhere (lost, revoked): its open gap no longer applies."""
        self._open.pop(tp, None)
