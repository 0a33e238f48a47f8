"""docs/scaling.md's cluster model, held to every primary's own counters.

A real worker process and the SDK run against the session's Redis Cluster (3 primaries,
3 replicas). ``INFO commandstats`` and the net byte counters of every primary are
summed and compared with ``bench.capacity_cluster``'s prediction, which is exact for
the IDs the run submitted: their hash tags fix how many script calls each chunk and
batch takes (one per slot group) and which primary runs each command. The bounds come
from the formulas plus what an idle window of the same fleet did in as long, never from
a past run, and nothing here is timed.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchfleet.bench.capacity import CapacityPlan
from batchfleet.bench.capacity_run import measure_capacity
from batchfleet.schemas.names import RESULT_TAGS
from tests.support.redis_cluster import RedisClusterServers

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(240)]

#: Commands whose count the model gives exactly (background aside), summed and per primary.
EXACT = ("eval", "hsetnx", "hset", "expire", "xadd", "hmget", "spublish", "xack", "xdel",
         "info", "xlen")
#: Single-node commands no request path sends on a cluster.
GONE = ("publish", "multi", "exec")
#: The clients' safety poll: every 10th poll re-reads every outstanding wait (16 EVAL per
#: 2,000 IDs here). At 5 s none falls inside a run, however slow the shared box is.
POLL_S = 5.0
#: The idle window: as long as the worker's slowest loop (the metrics sample, every 5 s:
#: an XLEN per lane and per dead-letter stream), so the background holds one of each.
IDLE_S = 5.0
#: Bytes per request may differ from the RESP arithmetic by this fraction (measured: 1%).
BYTES_TOLERANCE = 0.10


def _slack(row: dict[str, Any]) -> float:
    """Room above the formula: twice what the idle fleet did in as long, plus a few."""
    return 2.0 * float(row["background"]) + 5


def _check(found: dict[str, Any]) -> None:
    rows = found["commands"]
    for command in EXACT:
        row = rows[command]
        assert row["predicted"] <= row["measured"] <= row["predicted"] + _slack(row), (
            command, row)
    for command in GONE:
        assert rows[command]["measured"] <= _slack(rows[command]), (command, rows[command])
    for command in ("xreadgroup", "xclaim"):
        row = rows[command]
        assert row["predicted_low"] <= row["measured"] <= row["predicted_high"] + _slack(row), (
            command, row)
    # each primary runs what its tags and fixed keys say: the spread is predicted too
    for primary, row in found["per_primary"].items():
        for command in EXACT:
            cell = row["commands"][command]
            assert cell["predicted"] <= cell["measured"] <= (
                cell["predicted"] + _slack(rows[command])), (primary, command, cell)
    assert sum(len(r["result_tags"]) for r in found["per_primary"].values()) == RESULT_TAGS
    # a script call per slot group: at most 16 per chunk, at most min(B, 16) per batch
    calls = found["script_calls"]
    assert calls["put_pending"] <= RESULT_TAGS * found["chunks"]
    assert found["batches"] <= calls["write"] <= RESULT_TAGS * found["batches"]
    sizes = found["sizes"]
    for side in ("in", "out"):
        row = found["bytes_per_request"][side]
        assert abs(row["measured"] - row["predicted"]) <= BYTES_TOLERANCE * row["predicted"], (
            side, row)
    # every primary has a replica: at least the payload and both bodies are replicated
    assert found["bytes_per_request"]["replication_out"]["measured"] >= (
        sizes["request"] + sizes["pending"] + sizes["result"])
    reads = found["reads"]["commands"]
    for command in ("eval", "hmget"):
        row = reads[command]
        assert row["predicted"] <= row["measured"] <= row["predicted"] + 5, reads


async def test_a_cluster_costs_what_the_cluster_model_says(
        redis_cluster_servers: RedisClusterServers) -> None:
    """Full batches on 3 primaries: EVAL per slot group (16 per 1,000-request chunk,
    about 16 per batch of 256), one SPUBLISH per batch, the ack one script per batch,
    INFO from every primary per chunk; per request the same 8 keyed commands as on
    one node, each on the primary its request ID's tag maps to."""
    found = await measure_capacity(CapacityPlan(requests=3000, queued=1000,
                                                redis_url=redis_cluster_servers.url,
                                                poll_interval_s=POLL_S, idle_s=IDLE_S))
    assert found["cluster"] and len(found["primaries"]) == 3
    assert found["succeeded"] == found["requests"] == 3000
    _check(found)
    assert found["round_trips_per_request"]["read"] == 0


async def test_small_batches_and_two_clients_on_a_cluster(
        redis_cluster_servers: RedisClusterServers) -> None:
    """Batches of 16 hold about 10 of the 16 tags: about 10 write calls per batch, still
    predicted exactly; with two clients a batch announces once per client channel in it."""
    found = await measure_capacity(CapacityPlan(
        requests=1000, clients=2, max_batch_size=16, gets=10, foreign_waits=100, queued=0,
        redis_url=redis_cluster_servers.url, poll_interval_s=POLL_S, idle_s=IDLE_S))
    assert found["succeeded"] == found["requests"] == 1000
    assert found["batches"] >= 1000 // 16
    assert found["script_calls"]["write"] < 16 * found["batches"]
    _check(found)
