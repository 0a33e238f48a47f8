"""The shard a request goes to: stable, uniform, and shard 0 is today's stream name."""

from __future__ import annotations

import uuid
import zlib
from collections import Counter

import pytest

from batchfleet.connectors.fleet import StreamStats, combine_shards
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names, shard_for
from batchfleet.schemas.registry import decode_record
from batchfleet.workers.settings import WorkerSettings, setting_options

pytestmark = pytest.mark.unit


def test_shard_0_is_the_unsharded_stream_and_others_add_a_suffix() -> None:
    names = Names()
    assert names.stream("demo-mlp", "interactive") == "bf:stream:demo-mlp:interactive"
    assert names.stream("demo-mlp", "interactive", 0) == "bf:stream:demo-mlp:interactive"
    assert names.stream("demo-mlp", "bulk", 3) == "bf:stream:demo-mlp:bulk:3"
    assert names.shard_streams("m", "bulk", 1) == ["bf:stream:m:bulk"]
    assert names.shard_streams("m", "bulk", 3) == ["bf:stream:m:bulk", "bf:stream:m:bulk:1",
                                                   "bf:stream:m:bulk:2"]


def test_the_choice_is_crc32_of_the_id_and_stable() -> None:
    # the documented rule (docs/wire-format.md), which a raw-wire producer reimplements
    for rid in ("req-1", "ü-ñ", str(uuid.UUID(int=7))):
        assert shard_for(rid, 4) == zlib.crc32(rid.encode()) % 4
        assert shard_for(rid, 4) == shard_for(rid, 4)
    assert shard_for("req-1", 4) == 1  # crc32(b"req-1") = 1829706545: the same anywhere
    assert {shard_for(f"r{i}", 1) for i in range(100)} == {0}
    assert shard_for("anything", 0) == 0


@pytest.mark.parametrize("shards", [2, 4, 7])
def test_the_choice_is_uniform(shards: int) -> None:
    n = 40_000
    counts = Counter(shard_for(str(uuid.UUID(int=i * 7919)), shards) for i in range(n))
    assert set(counts) == set(range(shards))
    assert all(abs(c - n / shards) < 0.05 * n / shards for c in counts.values()), counts


def test_the_record_reads_the_high_water_mark() -> None:
    record = decode_record("m", {b"lane_shards": b"2", b"lane_shards_max": b"4"})
    assert record is not None
    assert (record.lane_shards, record.lane_shards_max, record.consumed_shards) == (2, 4, 4)
    plain = decode_record("m", {b"lane_shards": b"1"})
    assert plain is not None and plain.consumed_shards == 1


def test_status_adds_up_the_shards() -> None:
    lane = combine_shards([StreamStats(3, 1.5, 1, 2), StreamStats(0, None, 0, 0),
                           StreamStats(5, 9.0, None, 1)])
    assert lane == StreamStats(8, 9.0, 1, 3, shards=3)


def test_lane_shards_setting_is_per_model_and_refused_on_kafka() -> None:
    settings = WorkerSettings.from_url("redis://localhost:6379/0")
    assert settings.lane_shards_by_model == {"demo-mlp": 1}
    option = next(o for o in setting_options(WorkerSettings) if o.name == "lane_shards")
    sharded = settings.replace(lane_shards=option.parse(("demo-mlp=4",)))
    assert sharded.lane_shards_by_model == {"demo-mlp": 4}
    with pytest.raises(ConfigError, match="from 1 to 64"):
        option.parse(("demo-mlp=0",))
    kafka = WorkerSettings.from_url("kafka://localhost:9092", "redis://localhost:6379/0")
    with pytest.raises(ConfigError, match="Redis Streams only"):
        kafka.replace(lane_shards=option.parse(("demo-mlp=2",)))
