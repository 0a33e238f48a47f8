"""The console's pure parts (issue 30): the rows the page shows, the sparkline history,
the rollout card, and the session and CSRF rules (no server, no Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchfleet.connectors.fleet import WorkerView, summarize
from batchfleet.producers.console.sessions import KeySource, Sessions
from batchfleet.producers.console.views import History, model_rows, rollout_json
from batchfleet.producers.gateway import hash_key
from batchfleet.schemas.errors import AuthError

pytestmark = pytest.mark.unit


def _worker(wid: str, seen_s_ago: float = 1.0) -> WorkerView:
    lanes = {"a/interactive": {"p50_ms": 5.0, "p95_ms": 9.0, "p99_ms": 12.0,
                               "queue_p99_ms": 7.0, "compute_p99_ms": 3.0}}
    return WorkerView(wid, "h", ("a",), "cpu", "redis", {}, 0, 10.0, seen_s_ago, 60.0,
                      {"cache_hits": 3, "cache_misses": 1}, lanes, model_stats={
                          "a": {"rps": 10.0, "batches": 4, "rows": 32, "succeeded": 32,
                                "max_batch_size": 64}})


def test_a_model_row_adds_its_lanes_and_takes_the_worst_latency() -> None:
    snap = summarize("redis", "bf", ["a"], [_worker("w1"), _worker("w2")], {}, {})
    (row,) = model_rows(snap)
    assert row["rps"] == 20.0 and row["mean_batch_size"] == 8.0
    assert row["batch_fill"] == 8 / 64 and row["cache_hit_ratio"] == 0.75
    assert row["latency_ms"]["p99_ms"] == 12.0 and row["latency_ms"]["compute_p99_ms"] == 3.0
    assert set(row["lanes"]) == {"interactive", "bulk"}


def test_history_keeps_one_point_per_period_and_shows_the_newest_between() -> None:
    history = History(every_s=10.0, span_s=30.0)
    row = {"model": "a", "rps": 1.0, "depth": 0, "p99_ms": None}
    history.add(0.0, [row], {"a": (100.0, 0.0)})
    history.add(5.0, [row], {"a": (150.0, 5.0)})  # between points: shown, not kept
    assert history.series()["t"] == [0.0, 5.0]
    history.add(10.0, [row], {"a": (200.0, 10.0)})
    series = history.series()
    assert series["t"] == [0.0, 10.0]
    assert series["models"]["a"]["error_rate"] == [None, 0.1]  # over the interval
    for t in (20.0, 30.0, 40.0):
        history.add(t, [row], {"a": (200.0, 10.0)})
    assert history.series()["t"] == [20.0, 30.0, 40.0]  # the span's worth


def test_a_rollout_card_only_for_models_with_a_history_newest_decision_first() -> None:
    assert rollout_json({"model": "a", "history": []}) is None
    history = [{"action": "rollback", "why": "p99"}, {"action": "set", "why": "ship"}]
    card = rollout_json({"model": "a", "policy": {"guard": {"p99_ratio": 2}},
                         "history": history})
    assert card is not None and card["decisions"][0]["why"] == "p99"
    assert card["guard"] == {"p99_ratio": 2}


def test_a_session_dies_with_its_key_and_csrf_is_per_session(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"root:{hash_key('k1')}:*:scopes=admin\n"
                    f"ops:{hash_key('k2')}:*:scopes=admin\nbill:{hash_key('k3')}:*\n")
    sessions = Sessions(KeySource(str(keys)))
    root, ops = sessions.sign_in("k1"), sessions.sign_in("k2")
    assert sessions.check(root.cookie).who == "root"
    with pytest.raises(AuthError) as forbidden:
        sessions.sign_in("k3")
    assert forbidden.value.forbidden
    sessions.check_csrf(root, sessions.csrf(root))
    with pytest.raises(AuthError):
        sessions.check_csrf(root, sessions.csrf(ops))
    with pytest.raises(AuthError):
        sessions.check(root.cookie.replace("root.", "ops."))  # another key's name
    with pytest.raises(AuthError):
        sessions.check(root.cookie, now=10**12)  # expired
    keys.write_text(f"ops:{hash_key('k2')}:*:scopes=admin\n")
    with pytest.raises(AuthError):
        sessions.check(root.cookie)
    assert sessions.check(ops.cookie).who == "ops"


def test_open_on_loopback_reads_need_nothing_but_actions_need_the_local_cookie() -> None:
    sessions = Sessions(None)
    anonymous = sessions.check(None)
    assert anonymous.who == "local"
    with pytest.raises(AuthError):
        sessions.check_csrf(anonymous, sessions.csrf(anonymous))
    local = sessions.sign_in(None)
    sessions.check_csrf(sessions.check(local.cookie), sessions.csrf(local))


async def test_the_overview_and_dlq_pages_read_a_memory_fleet() -> None:
    """``memory://`` through the same door: the reads are the control plane's seams, and the
    dead letters page newest first, as on Redis (``XREVRANGE``)."""
    import uuid

    from batchfleet.connectors import open_broker, open_control_plane
    from batchfleet.connectors.values import DeadLetter
    from batchfleet.producers.console.reads import ConsoleReads

    url = f"memory://console-{uuid.uuid4().hex[:8]}"
    plane = open_control_plane(url)
    letters = [DeadLetter(f"r{i}", "m", b"x", 1, [{"type": "model_error", "message": "boom"}],
                          "exhausted") for i in range(3)]
    await plane.dead_letters.add(letters)
    reads = ConsoleReads(plane, open_broker(url), cache_s=0.0)
    try:
        overview = await reads.overview()
        assert [m["model"] for m in overview["models"]] == ["m"]
        (queue,) = overview["dlq"]
        assert [x["request_id"] for x in queue["letters"]] == ["r2", "r1", "r0"]
        older = await reads.dead_letters("m", before=queue["letters"][0]["entry_id"], limit=1)
        assert [x["request_id"] for x in older["letters"]] == ["r1"]
        assert queue["error_types"] == {"model_error": 3}
    finally:
        await reads.close()
        await plane.close()
