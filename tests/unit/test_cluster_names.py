"""Cluster key names and ``redis+cluster://`` URLs: single-node names unchanged, every
script's keys in one slot."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from batchfleet.connectors.redis_client import cluster_nodes, names_for
from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names, result_tag

pytestmark = pytest.mark.unit


def test_single_node_names_are_unchanged() -> None:
    names = Names("bf")
    assert names.result("req-1") == "bf:result:req-1"
    assert names.stream("m", "interactive", 2) == "bf:stream:m:interactive:2"
    assert names.notify_channel("c0ffee") == "bf:notify:c0ffee"
    assert names.retry_schedule == "bf:retry" and names.model("m") == "bf:model:m"


def test_cluster_names_carry_hash_tags() -> None:
    names = Names("bf", cluster=True)
    assert names.result("req-1") == f"bf:result:{{r{result_tag('req-1')}}}:req-1"
    assert names.stream("m", "interactive") == "bf:stream:{m:interactive}"
    assert names.stream("m", "interactive", 2) == "bf:stream:{m:interactive:2}"
    assert names.notify_channel("c0ffee") == "bf:notify:{c0ffee}"
    plane = [names.retry_schedule, names.model("m"), names.model_registry, names.lane_loss,
             names.cancelled, names.dead_letter_stream("m"), names.inflight_prefix + "k",
             names.quota_bucket("k"), names.live_workers, names.bulk_jobs]
    assert len({key_slot(k.encode()) for k in plane}) == 1  # the control plane: one slot
    assert len({key_slot(names.result(f"r{i}").encode()) for i in range(500)}) == 16


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
