"""Lane losses: when a recreated lane lost its entries, and which waits that ends."""

from __future__ import annotations

import msgpack
import pytest

from batchfleet.connectors.redis_streams import LOSS_MARGIN_MS, PAYLOAD_FIELD, loss_moment
from batchfleet.producers.waiting import lost_in_lane

pytestmark = pytest.mark.unit


def _entry(added_ms: int, enqueued_s: float) -> tuple[bytes, dict[bytes, bytes]]:
    payload = msgpack.packb({"v": 1, "id": "r", "model": "m", "enqueued_at": enqueued_s})
    return f"{added_ms}-0".encode(), {PAYLOAD_FIELD: payload}


def test_loss_moment_is_the_earliest_fresh_enqueued_at() -> None:
    """Entries added after the loss survive: their requests must not count as lost."""
    entries = [_entry(10_000, 9.990), _entry(10_001, 9.980), _entry(10_002, 10.0)]
    assert loss_moment(entries) == 9_980


def test_a_republished_retry_does_not_drag_the_moment_back() -> None:
    """A retry keeps its first enqueued_at, long before it was added again."""
    entries = [_entry(50_000, 1.0), _entry(50_001, 49.995)]
    assert loss_moment(entries) == 49_995


def test_without_readable_entries_the_margin_applies() -> None:
    assert loss_moment([(b"20000-0", {PAYLOAD_FIELD: b"junk"})]) == 20_000 - LOSS_MARGIN_MS


def test_a_wait_is_lost_only_if_enqueued_before_its_models_loss() -> None:
    losses = {"m:interactive": 10_000, "other:bulk": 99_000}
    assert lost_in_lane(("m", 9.999), losses)
    assert not lost_in_lane(("m", 10.0), losses)
    assert not lost_in_lane(("m2", 1.0), losses)  # "m:" is not a prefix of "m2:"
