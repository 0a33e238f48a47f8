"""One behaviour, three backends: the same cases against ``memory://``, a real Redis and a
real Redis Cluster. ``memory://`` is only worth having if it behaves as Redis does;
these are the rules the runtime leans on (first terminal write wins, generation fencing,
duplicate submits, claims of a dead consumer's entries, announcements in both formats,
one dead letter per generation, leased retries)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from batchfleet.connectors import (
    Consumer,
    ControlPlane,
    Publisher,
    SubmitState,
    TerminalWrite,
    open_broker,
    open_control_plane,
)
from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.values import DeadLetter, Lettered, Ownership, Retry
from batchfleet.schemas.envelopes import NOTIFY_RESULTS
from batchfleet.schemas.errors import UnknownModelError, ValidationError
from batchfleet.schemas.names import LANE_INTERACTIVE, Names
from batchfleet.schemas.registry import Declaration, ModelVersion

pytestmark = pytest.mark.integration


@dataclass
class Backend:
    kind: str
    url: str
    names: Names
    plane: ControlPlane
    closing: list[Any]

    def publisher(self) -> Publisher:
        found = open_broker(self.url, namespace=self.names.prefix).publisher()
        self.closing.append(found)
        return found

    def consumer(self, name: str, claim_idle_ms: int = 60_000) -> Consumer:
        found = open_broker(self.url, namespace=self.names.prefix,
                            claim_idle_ms=claim_idle_ms).consumer(name)
        self.closing.append(found)
        return found


@pytest.fixture(params=["memory", "redis", pytest.param("cluster", marks=pytest.mark.cluster)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    kind = str(request.param)
    names = Names(f"par{uuid.uuid4().hex[:8]}")
    if kind == "memory":
        url = f"memory://parity-{uuid.uuid4().hex[:8]}"
    elif kind == "redis":
        url = str(request.getfixturevalue("redis_url"))
    else:
        url = str(request.getfixturevalue("redis_cluster_servers").url)
    plane = open_control_plane(url, namespace=names.prefix, result_ttl_s=600)
    found = Backend(kind, url, names, plane, [])
    try:
        yield found
    finally:
        for closable in found.closing:
            await closable.close()
        await plane.close()


def rid() -> str:
    return uuid.uuid4().hex


async def test_first_terminal_write_wins_and_generations_fence(backend: Backend) -> None:
    results = backend.plane.results
    a = rid()
    assert await results.put_pending([(a, b"p0")]) == [SubmitState.NEW]
    assert await results.put_pending([(a, b"p1")]) == [SubmitState.PENDING]
    assert await results.get_bodies([a]) == [b"p0"]
    assert await results.get_bodies([a], terminal_only=True) == [None]
    assert await results.write_terminal([TerminalWrite(a, "failed", b"f0")]) == [True]
    assert await results.write_terminal([TerminalWrite(a, "succeeded", b"s0")]) == [False]
    assert await results.put_pending([(a, b"p2")]) == [SubmitState.TERMINAL]
    assert await results.get_bodies([a], terminal_only=True) == [b"f0"]
    # a DLQ replay raises the generation: the old generation's late write never lands
    assert await results.reopen_for_replay([(a, b"p3"), (rid(), b"x")]) == [1, -1]
    assert await results.write_terminal([TerminalWrite(a, "succeeded", b"old", generation=0)]
                                        ) == [False]
    assert await results.write_terminal([TerminalWrite(a, "succeeded", b"new", generation=1)]
                                        ) == [True]
    assert await results.reopen_for_replay([(a, b"p4")]) == [-1]  # succeeded: not replayed
    [rec] = await results.get_records([a], with_body=True)
    assert rec is not None and (rec.status, rec.body) == ("succeeded", b"new")
    assert await results.missing([a, "nope"]) == ["nope"]


async def test_replay_reopens_a_degraded_success_and_not_a_model_answer(
        backend: Backend) -> None:
    """docs/degradation.md: a success a fallback gave is reopened by DLQ replay, under a
    new generation; one the model computed is not."""
    import numpy as np

    from batchfleet.schemas.envelopes import ErrorInfo, Result, encode_result

    results = backend.plane.results
    degraded, computed, lookalike = rid(), rid(), rid()
    await results.put_pending([(degraded, b"p"), (computed, b"p"), (lookalike, b"p")])
    outputs = np.array([0.5], np.float32)
    # a model's answer whose output bytes hold the degraded mark is still the model's
    marked = np.frombuffer(b"\xa8degraded\xc3" * 2, np.uint8)
    bodies = [encode_result(Result(degraded, "succeeded", outputs, degraded=True,
                                   degraded_reason="error", fallback="value",
                                   degraded_error=ErrorInfo("model_error", "down", True))),
              encode_result(Result(computed, "succeeded", outputs)),
              encode_result(Result(lookalike, "succeeded", marked))]
    assert await results.write_terminal([TerminalWrite(degraded, "succeeded", bodies[0]),
                                         TerminalWrite(computed, "succeeded", bodies[1]),
                                         TerminalWrite(lookalike, "succeeded", bodies[2])]
                                        ) == [True, True, True]
    assert await results.reopen_for_replay([(degraded, b"p1"), (computed, b"p1"),
                                            (lookalike, b"p1")]) == [1, -1, -1]
    assert await results.write_terminal([TerminalWrite(degraded, "succeeded", b"model",
                                                       generation=1)]) == [True]


async def test_duplicate_submits_and_fingerprints(backend: Backend) -> None:
    results: Any = backend.plane.results  # withdraw_pending: not yet on the Results protocol
    a, b = rid(), rid()
    owned = [Ownership("key1", "fp1", "client1")]
    assert await results.put_pending([(a, b"p")], owned) == [SubmitState.NEW]
    assert await results.put_pending([(a, b"p")], owned) == [SubmitState.PENDING]
    assert await results.put_pending([(a, b"p")], [Ownership("key1", "fp2")]) == [
        SubmitState.CONFLICT]
    # stored without a fingerprint (an SDK-made ID): any fingerprint matches
    assert await results.put_pending([(b, b"p")]) == [SubmitState.NEW]
    assert await results.put_pending([(b, b"p")], [Ownership(None, "fp9")]) == [
        SubmitState.PENDING]
    [rec, none] = await results.get_records([a, rid()])
    assert rec is not None and (rec.status, rec.owner, rec.fingerprint) == (
        "pending", "key1", "fp1") and none is None
    # a failed submit withdraws what it created, never a delivered or finished record
    assert await results.withdraw_pending([a, b]) == 2
    assert await results.missing([a, b]) == [a, b]


async def test_delivery_counts_and_done_generation(backend: Backend) -> None:
    results = backend.plane.results
    a = rid()
    await results.put_pending([(a, b"p")])
    [first] = await results.count_deliveries([(a, 0)])
    assert (first.deliveries, first.done_gen, first.gen) == (1, -1, 0)
    [again] = await results.count_deliveries([(a, 3)])
    assert again.deliveries == 4
    [read] = await results.count_deliveries([(a, -1)])  # only reads
    assert read.deliveries == 4
    await results.mark_solo(a, started=True)
    assert (await results.count_deliveries([(a, -1)]))[0].solo == 1
    await results.mark_solo(a, started=False, attempt=2)
    assert tuple((await results.count_deliveries([(a, -1)]))[0])[:2] == (2, 0)
    assert await results.note_stalls([a, a]) == [1, 2]
    await results.write_terminal([TerminalWrite(a, "succeeded", b"s")])
    assert (await results.count_deliveries([(a, -1)]))[0].done_gen == 0


async def test_log_claims_rise_with_their_offset_and_only_with_it(backend: Backend) -> None:
    """Each claim answers what was handed out before it; a timestamp rises only with its
    offset (a log that went back must not date its new records into the old range)."""
    results = backend.plane.results
    t = 1_764_000_000_000  # epoch ms: past a Lua number's 14 significant digits
    assert await results.claim_positions([("g/t/0", 255, t), ("g/t/1", 9, t + 5)]) == [
        (-1, -1), (-1, -1)]
    assert await results.claim_positions([("g/t/0", 511, t + 7)]) == [(255, t)]
    # a fetch that stays below the claim (a redelivery, or a log that went back)
    assert await results.claim_positions([("g/t/0", 300, t + 99), ("g/t/1", 9, t + 99)]) == [
        (511, t + 7), (9, t + 5)]
    assert await results.claim_positions([("g/t/0", 600, t + 1)]) == [(511, t + 7)]
    assert await results.claim_positions([("g/t/0", 600, t + 1)]) == [(600, t + 7)]
    assert await results.claim_positions([]) == []
    if backend.kind != "memory":  # one hash under the control plane, kept like results
        ttl = await results.redis.ttl(backend.names.for_cluster(
            backend.kind == "cluster").log_claims)
        assert 0 < ttl <= 600


async def test_lane_losses_only_move_forward(backend: Backend) -> None:
    results = backend.plane.results
    await results.mark_lane_losses({"m:interactive": 200})
    await results.mark_lane_losses({"m:interactive": 100, "m:bulk": 5})
    assert await results.lane_losses() == {"m:interactive": 200, "m:bulk": 5}


async def _announced(subscription: Any, count: int) -> list[tuple[str, bytes | None]]:
    """What the subscription hears until ``count`` results came, or 10 s passed."""
    got: list[tuple[str, bytes | None]] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got.extend(await subscription.next(0.5))
    return got


async def test_announcements_in_both_formats(backend: Backend) -> None:
    results, client = backend.plane.results, f"c{uuid.uuid4().hex[:6]}"
    subscription = await backend.plane.announcements.subscribe(client)
    try:
        ids = [rid() for _ in range(4)]
        await results.put_pending([(i, b"p") for i in ids])
        await results.write_terminal([
            TerminalWrite(ids[0], "succeeded", b"x", client, notify_format=NOTIFY_RESULTS),
            TerminalWrite(ids[1], "succeeded", b"y" * 300, client,
                          notify_format=NOTIFY_RESULTS),
            TerminalWrite(ids[2], "succeeded", b"z", client),
            TerminalWrite(ids[3], "failed", b"w", "someone-else")])
        # a write that loses announces nothing
        await results.write_terminal([TerminalWrite(ids[2], "failed", b"late", client)])
        got = await _announced(subscription, 3)
        assert sorted(got, key=lambda a: ids.index(a[0])) == [
            (ids[0], b"x"), (ids[1], b"y" * 300), (ids[2], None)]
        assert await subscription.next(0.2) == []
    finally:
        await subscription.close()


async def test_an_announcement_leaves_out_the_writes_that_lost(backend: Backend) -> None:
    """Redis sends the message the worker built only when every write in it won; else it
    rebuilds one from the winners, and sends none when all lost."""
    results, client = backend.plane.results, f"c{uuid.uuid4().hex[:6]}"
    subscription = await backend.plane.announcements.subscribe(client)

    def done(request_id: str, body: bytes, status: str = "succeeded") -> TerminalWrite:
        return TerminalWrite(request_id, status, body, client, notify_format=NOTIFY_RESULTS)

    try:
        ids = [rid() for _ in range(4)]
        await results.put_pending([(i, b"p") for i in ids])
        assert await results.write_terminal([done(ids[1], b"first", "failed")]) == [True]
        assert await _announced(subscription, 1) == [(ids[1], b"first")]
        won = await results.write_terminal([done(i, i.encode() * 9) for i in ids])
        assert won == [True, False, True, True]
        assert await _announced(subscription, 3) == [(i, i.encode() * 9)
                                                     for i in (ids[0], ids[2], ids[3])]
        assert await results.write_terminal([done(ids[0], b"again"), done(ids[2], b"again")]
                                            ) == [False, False]
        assert await subscription.next(0.3) == []
    finally:
        await subscription.close()


async def test_claims_take_a_dead_consumers_idle_entries(backend: Backend) -> None:
    model = f"m{uuid.uuid4().hex[:6]}"
    publisher = backend.publisher()
    dead, alive = backend.consumer("dead", 200), backend.consumer("alive", 200)
    await dead.start([model])
    await alive.start([model])
    await publisher.publish([OutboundMessage(model, LANE_INTERACTIVE, str(i), b"%d" % i)
                             for i in range(3)])
    taken = await dead.fetch(10, 2.0)
    assert [d.payload for d in taken] == [b"0", b"1", b"2"]
    assert all(d.delivery_count == 1 for d in taken)
    assert await alive.fetch(10, 0.1) == []  # held by "dead", not idle yet
    await dead.keep_alive(taken[:1])  # its holder is alive: entry 0 is not reclaimed
    await asyncio.sleep(0.15)
    await dead.keep_alive(taken[:1])
    await asyncio.sleep(0.15)
    claimed: list[Any] = []
    deadline = time.monotonic() + 10
    while len(claimed) < 2 and time.monotonic() < deadline:
        claimed += await alive.fetch(10, 0.2)
    assert sorted(d.payload for d in claimed) == [b"1", b"2"]
    assert all(d.delivery_count == 2 for d in claimed)
    await alive.ack(claimed)
    await dead.ack(taken[:1])
    [lane] = [b for b in await alive.backlog() if b.lane == LANE_INTERACTIVE]
    assert lane.depth == 0


async def test_pause_and_resume_per_model(backend: Backend) -> None:
    m1, m2 = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    publisher, consumer = backend.publisher(), backend.consumer("c")
    await consumer.start([m1, m2])
    await consumer.pause([m1])
    await publisher.publish([OutboundMessage(m1, LANE_INTERACTIVE, "1", b"1"),
                             OutboundMessage(m2, LANE_INTERACTIVE, "2", b"2")])
    got = await consumer.fetch(10, 1.0)
    assert [d.model for d in got] == [m2]
    backlog = {(b.model, b.lane): b.depth for b in await consumer.backlog()}
    assert backlog[(m1, LANE_INTERACTIVE)] == 1
    await consumer.resume()
    got2 = await consumer.fetch(10, 1.0)
    assert [d.model for d in got2] == [m1]
    await consumer.ack([*got, *got2])


async def test_one_dead_letter_per_generation(backend: Backend) -> None:
    results, dlq = backend.plane.results, backend.plane.dead_letters
    model, a = f"m{uuid.uuid4().hex[:6]}", rid()
    await results.put_pending([(a, b"p")])
    errors = [{"attempt": 1, "type": "model_error", "message": "x", "at": 1.0}]
    letter = DeadLetter(a, model, b"env", 3, errors, "model_error")
    assert await dlq.add([letter]) == [Lettered.ADDED]
    assert await dlq.add([letter]) == [Lettered.KNOWN]
    await results.write_terminal([TerminalWrite(a, "failed", b"f")])
    assert await results.reopen_for_replay([(a, b"p")]) == [1]
    assert await dlq.add([letter]) == [Lettered.STALE]  # generation 0 was superseded
    assert await dlq.models() == [model]
    [stored] = await dlq.list(model)
    assert (stored.request_id, stored.envelope, stored.errors) == (a, b"env", errors)
    assert await dlq.sizes([model]) == {model: 1}
    assert await dlq.remove([stored]) == 1 and await dlq.size(model) == 0
    await dlq.add([DeadLetter(a, model, b"env", 3, errors, "model_error", generation=1)])
    if backend.kind == "cluster":  # found by this suite; connectors/ is not ours to fix here
        pytest.xfail("DeadLetterQueue.purge on Redis Cluster: the cluster pipeline's UNLINK "
                     "is a coroutine, so the transaction runs XLEN alone")
    assert await dlq.purge(model) == 1


async def test_retry_schedule_leases_and_liveness(backend: Backend) -> None:
    results, schedule = backend.plane.results, backend.plane.retry_schedule
    live, done = rid(), rid()
    await results.put_pending([(live, b"p"), (done, b"p")])
    await results.write_terminal([TerminalWrite(done, "succeeded", b"s")])
    assert await schedule.add_live([Retry(100.0, b"a", live, 0), Retry(100.0, b"b", done, 0),
                                    Retry(100.0, b"c", rid(), 0)]) == [True, False, True]
    await schedule.add([(300.0, b"d")])
    assert sorted(await schedule.claim_due(now=250.0, lease_s=30)) == [b"a", b"c"]
    assert await schedule.claim_due(now=260.0, lease_s=30) == []  # leased, not due
    assert sorted(await schedule.claim_due(now=281.0, lease_s=30)) == [b"a", b"c"]
    await schedule.done([b"a", b"c"])
    assert await schedule.size() == 1 and await schedule.next_due() == 300.0


async def test_heartbeats_and_registry(backend: Backend) -> None:
    beats, models = backend.plane.heartbeats, backend.plane.models
    assert await beats.write("w1", {"worker_id": "w1", "models": ["m"]}, 10) is False
    assert await beats.write("w1", {"worker_id": "w1", "models": ["m"]}, 10) is True
    assert [r.worker_id for r in await beats.read_all()] == ["w1"]
    await beats.forget("w1")
    assert await beats.read_all() == []
    name = f"m{uuid.uuid4().hex[:6]}"
    await models.declare(name, Declaration(at=time.time()))
    assert await models.serve("w1", {name: [ModelVersion("v1", "sha:1"),
                                            ModelVersion("v2", "sha:2")]},
                              lane_shards={name: 3}) == 0
    assert (await models.consumed_shards([name, "other"])) == {name: 3, "other": 1}
    policy = await models.set_policy(name, stable="v1", canary="v2", percent=10, who="t")
    assert (policy.canary, policy.epoch) == ("v2", 1)
    promoted = await models.promote(name, who="t")
    assert (promoted.stable, promoted.previous, promoted.epoch) == ("v2", "v1", 2)
    assert [c.action for c in await models.history(name)] == ["promote", "set"]
    record = await models.get(name)
    assert record is not None and sorted(record.versions) == ["v1", "v2"]
    assert name in await models.names()


async def test_rollout_policy_changes(backend: Backend) -> None:
    """Routing's source of truth: every change bumps the epoch once, even when changes
    race; unknown versions and models are refused; rollback undoes canary, then stable."""
    models, name = backend.plane.models, f"m{uuid.uuid4().hex[:6]}"
    await models.serve("w1", {name: [ModelVersion(v, f"sha:{v}") for v in ("v1", "v2", "v3")]})
    with pytest.raises(ValidationError, match="no version 'v9'"):
        await models.set_policy(name, stable="v9", who="t")
    with pytest.raises(UnknownModelError):
        await models.promote(f"x{name}", who="t")
    changes = await asyncio.gather(*(models.set_policy(
        name, stable="v1", canary="v2", percent=p, who="t") for p in (10.0, 20.0, 30.0)))
    assert sorted(c.epoch for c in changes) == [1, 2, 3]
    back = await models.rollback(name, who="t", if_canary="v3")
    assert back is None  # the canary is not v3: nothing changes
    off = await models.rollback(name, who="t")
    assert (off.canary, off.stable, off.epoch) == (None, "v1", 4)
    moved = await models.set_policy(name, stable="v3", who="t")
    assert moved.previous == "v1"
    undone = await models.rollback(name, who="t")
    assert (undone.stable, undone.previous, undone.epoch) == ("v1", None, 6)
    assert (await models.policies([name, "absent"])) == {name: undone}
    assert len(await models.history(name, limit=2)) == 2


async def test_output_stats_merge_windows_and_keep_baselines(backend: Backend) -> None:
    """Two workers' deltas in one window read back as exactly their sum; a window that
    ended before ``since`` (or after ``until``) is left out, as are other labels and sides
    when some are named; a frozen baseline reads back whole."""
    import numpy as np

    from batchfleet.connectors.output_stats import Baseline, Flush
    from batchfleet.connectors.output_summary import summarise_batch

    stats, model = backend.plane.output_stats, "m"
    now = time.time()
    start = int(now // 60) * 60
    rng = np.random.default_rng(0)
    a = summarise_batch(list(rng.normal(size=(300, 2))), "scores")
    b = summarise_batch(list(rng.normal(size=(200, 2))), "scores")
    old = summarise_batch(list(rng.normal(size=(50, 2))), "scores")
    await stats.flush(model, Flush(start, 60, 3600, {("v1", "outputs"): a}))
    await stats.flush(model, Flush(start, 60, 3600, {("v1", "outputs"): b,
                                                      ("v1", "inputs"): old}))
    await stats.flush(model, Flush(start - 600, 60, 3600, {("v1", "outputs"): old}))
    got = await stats.read(model, since=now - 60)
    out = got[("v1", "outputs")]
    assert out.rows == 500
    assert out.series["output"].count == 1000
    assert out.series["output"].classes == {
        c: a.series["output"].classes.get(c, 0) + b.series["output"].classes.get(c, 0)
        for c in (0, 1)}
    assert got[("v1", "inputs")].rows == 50
    assert (await stats.read(model, since=now - 3600))[("v1", "outputs")].rows == 550
    assert await stats.read("other", since=0) == {}
    # windows that end at or before ``until``; one label and side only
    old_only = await stats.read(model, since=now - 3600, until=start - 540)
    assert old_only[("v1", "outputs")].rows == 50 and ("v1", "inputs") not in old_only
    picked = await stats.read(model, since=now - 60, labels=("v1",), side="inputs")
    assert list(picked) == [("v1", "inputs")]
    assert await stats.read(model, since=now - 60, labels=("v2",)) == {}
    await stats.freeze(model, Baseline("v1", now, 600.0, {"outputs": out}))
    bases = await stats.baselines(model, ["v1", "v2"])
    assert list(bases) == ["v1"]
    assert bases["v1"].sides["outputs"].series["output"].buckets == out.series["output"].buckets
    assert bases["v1"].since_s == 600.0
