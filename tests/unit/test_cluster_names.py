"""Cluster key names and ``redis+cluster://`` URLs: single-node names unchanged, every
script's keys in one slot."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from batchfleet.connectors.redis_client import cluster_nodes, names_for
from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import RESULT_TAG_TEXTS, RESULT_TAGS, Names, result_tag

pytestmark = pytest.mark.unit


def test_single_node_names_are_unchanged() -> None:
    names = Names("bf")
    assert names.result("req-1") == "bf:result:req-1"
    assert names.stream("m", "interactive", 2) == "bf:stream:m:interactive:2"
    assert names.notify_channel("c0ffee") == "bf:notify:c0ffee"
    assert names.retry_schedule == "bf:retry" and names.model("m") == "bf:model:m"


def test_cluster_names_carry_hash_tags() -> None:
    names = Names("bf", cluster=True)
    tag = RESULT_TAG_TEXTS[result_tag("req-1")]
    assert names.result("req-1") == f"bf:result:{{{tag}}}:req-1"
    assert names.stream("m", "interactive") == "bf:stream:{m:interactive}"
    assert names.stream("m", "interactive", 2) == "bf:stream:{m:interactive:2}"
    assert names.notify_channel("c0ffee") == "bf:notify:{c0ffee}"
    plane = [names.retry_schedule, names.model("m"), names.model_registry, names.lane_loss,
             names.cancelled, names.dead_letter_stream("m"), names.inflight_prefix + "k",
             names.quota_bucket("k"), names.live_workers, names.bulk_jobs, names.log_claims]
    assert len({key_slot(k.encode()) for k in plane}) == 1  # the control plane: one slot
    assert len({key_slot(names.result(f"r{i}").encode()) for i in range(500)}) == 16


def _crc16(data: bytes) -> int:
    """CRC16-XMODEM, the function Redis Cluster hashes keys with, written out."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def test_result_tags_sit_one_in_each_sixteenth_of_the_slots() -> None:
    """The table is what its comment says: for each i the first ``r<i>`` or ``r<i>.<j>``
    whose slot is in the middle half of slots [1024 i, 1024 (i + 1)), so an even split
    of the slots over P <= 16 primaries gives each 16/P tags, give or take one."""
    assert _crc16(b"123456789") == 0x31C3  # the standard check value
    derived = []
    for i in range(RESULT_TAGS):
        j = 0
        while not 1024 * i + 256 <= _crc16((f"r{i}.{j}" if j else f"r{i}").encode()) % 16384 \
                < 1024 * i + 768:
            j += 1
        derived.append(f"r{i}.{j}" if j else f"r{i}")
    assert tuple(derived) == RESULT_TAG_TEXTS
    for i, tag in enumerate(RESULT_TAG_TEXTS):
        assert key_slot(f"{{{tag}}}:x".encode()) // 1024 == i
    for primaries in (3, 4, 5, 7):  # what redis-cli --cluster create hands out
        bounds = [16384 * p // primaries for p in range(primaries + 1)]
        held = [sum(bounds[p] <= key_slot(f"{{{t}}}".encode()) < bounds[p + 1]
                    for t in RESULT_TAG_TEXTS) for p in range(primaries)]
        assert max(held) - min(held) <= 1, (primaries, held)


def test_cluster_urls_parse_and_mixing_is_refused() -> None:
    url = "redis+cluster://10.0.0.1:7000,10.0.0.2:7001"
    assert cluster_nodes(url)[0] == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert BrokerURL.parse(url).kind == "redis"
    assert names_for(url, Names("x")) == Names("x", cluster=True)
    assert results_url_for(BrokerURL.parse(url), None) == url
    with pytest.raises(ConfigError, match="both be Redis Cluster"):
        results_url_for(BrokerURL.parse(url), "redis://h:1/0")
    with pytest.raises(ConfigError, match="only database 0"):
        cluster_nodes("redis+cluster://h:1/3")
    with pytest.raises(ConfigError, match="host:port"):
        BrokerURL.parse("redis+cluster://h")
