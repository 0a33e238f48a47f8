"""The one heartbeat codec (schemas.heartbeat): what workers write, readers decode."""

from __future__ import annotations

import msgpack
import pytest

from batchfleet.schemas.heartbeat import VERSION, decode_heartbeat, encode_heartbeat

pytestmark = pytest.mark.unit


def test_round_trip_keeps_every_field() -> None:
    info = {"worker_id": "w-1", "host": "h", "started_at": 10.0, "seen_at": 12.5,
            "models": ["m1", "m2"], "device": "cpu", "broker": "redis",
            "breakers": {"m1": "open", "store": "closed"}, "buffered": 3,
            "throughput_rps": 41.5, "counters": {"succeeded": 7, "failed": 1},
            "lanes": {"m1/interactive": {"backlog": 2.0, "p99_ms": None}}, "pid": 99}
    record = decode_heartbeat(encode_heartbeat(info))
    assert record is not None
    assert (record.worker_id, record.host, record.device, record.broker) == \
        ("w-1", "h", "cpu", "redis")
    assert (record.started_at, record.seen_at) == (10.0, 12.5)
    assert record.models == ("m1", "m2")
    assert record.breakers == {"m1": "open", "store": "closed"}
    assert (record.buffered, record.throughput_rps) == (3, 41.5)
    assert record.counters["succeeded"] == 7 and record.counters["failed"] == 1
    assert record.counters["batches"] == 0
    assert record.lanes == {"m1/interactive": {"backlog": 2.0, "p99_ms": None}}
    assert record.extra == {"pid": 99}


def test_unversioned_flat_counters_still_decode() -> None:
    """Workers from before the codec wrote no ``v`` and their counters at the top level."""
    raw = msgpack.packb({"worker_id": "old", "succeeded": 5, "models": ["m"]})
    record = decode_heartbeat(raw)
    assert record is not None and record.counters["succeeded"] == 5 and record.models == ("m",)


@pytest.mark.parametrize("raw", [
    b"\xc1 not msgpack", msgpack.packb([1, 2]), msgpack.packb({"host": "no id"}),
    msgpack.packb({"worker_id": "w", "v": VERSION + 1})])
def test_what_is_not_a_heartbeat_is_refused(raw: bytes) -> None:
    assert decode_heartbeat(raw) is None
