"""Golden bytes of every wire artefact (docs/wire-format.md §11).

Each artefact is pinned byte for byte as this version writes it, and read back as
a reader of this version reads it. A test failing here means a change of meaning
on the wire: §11 says that bumps ``v`` (or, for announcements, is negotiated by the
request), so either do that, or put the bytes back. Each test names its rule.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest

from batchfleet.connectors import TerminalWrite
from batchfleet.connectors.announcements import parse_announcement
from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.values import DeadLetter, Lettered, Ownership
from batchfleet.schemas.envelopes import (
    NOTIFY_RESULTS,
    Request,
    Result,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from batchfleet.schemas.heartbeat import decode_heartbeat, encode_heartbeat
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import (
    ModelVersion,
    RolloutPolicy,
    TensorSpec,
    decode_record,
    encode_served,
    pack,
)
from tests.support.seams import open_result_store

pytestmark = pytest.mark.integration
NAMES = Names("bf")
X = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], dtype=np.float32)
T0 = 1700000000.0

#: §9.1: the request a client that does not ask for bodies sends (216 bytes).
REQUEST = bytes.fromhex(
    "8ca17601a26964a87265712d30303031a56d6f64656ca864656d6f2d6d6c70a46c616e65ab696e7465"
    "72616374697665ab656e7175657565645f6174cb41d954fc40000000ab646561646c696e655f6174c0"
    "ac63616c6c6261636b5f75726cc0a66e6f74696679a6633066666565a7617474656d707401aa67656e"
    "65726174696f6e00a66572726f727390a6696e7075747383a56474797065a7666c6f61743332a57368"
    "617065910aa464617461c42800000000cdcccc3dcdcc4c3e9a99993ecdcccc3e0000003f9a99193f33"
    "33333fcdcc4c3f6666663f")
#: The same request asking for result bodies in its announcement: one optional key,
#: ``notify_format``, before ``inputs`` (238 bytes).
REQUEST_ASKING = bytes.fromhex(
    "8da17601a26964a87265712d30303031a56d6f64656ca864656d6f2d6d6c70a46c616e65ab696e7465"
    "72616374697665ab656e7175657565645f6174cb41d954fc40000000ab646561646c696e655f6174c0"
    "ac63616c6c6261636b5f75726cc0a66e6f74696679a6633066666565a7617474656d707401aa67656e"
    "65726174696f6e00a66572726f727390ad6e6f746966795f666f726d6174a7726573756c7473a6696e"
    "7075747383a56474797065a7666c6f61743332a57368617065910aa464617461c42800000000cdcccc"
    "3dcdcc4c3e9a99993ecdcccc3e0000003f9a99193f3333333fcdcc4c3f6666663f")
#: §9.3: the succeeded result (273 bytes).
RESULT = bytes.fromhex(
    "8fa17601a26964a87265712d30303031a6737461747573a9737563636565646564a76f757470757473"
    "83a56474797065a7666c6f61743332a573686170659101a464617461c4040b37f23ea56572726f72c0"
    "a56d6f64656ca864656d6f2d6d6c70ad6d6f64656c5f76657273696f6ebb64656661756c742f736861"
    "3235363a336261353132336338623064a8617474656d70747301ab656e7175657565645f6174cb41d9"
    "54fc40000000aa737461727465645f6174cb41d954fc40004189ab66696e69736865645f6174cb41d9"
    "54fc400049baa871756575655f6d73cb4010000000000000aa636f6d707574655f6d73cb3fe0000000"
    "000000aa62617463685f73697a6508aa67656e65726174696f6e00")
#: §9.2: the pending body the SDK stores (179 bytes).
PENDING = bytes.fromhex(
    "8fa17601a26964a87265712d30303031a6737461747573a770656e64696e67a76f757470757473c0a5"
    "6572726f72c0a56d6f64656ca864656d6f2d6d6c70ad6d6f64656c5f76657273696f6ea0a861747465"
    "6d70747300ab656e7175657565645f6174cb41d954fc40000000aa737461727465645f6174c0ab6669"
    "6e69736865645f6174c0a871756575655f6d73c0aa636f6d707574655f6d73c0aa62617463685f7369"
    "7a65c0aa67656e65726174696f6e00")


def _succeeded() -> Result:
    return Result("req-0001", "succeeded", outputs=np.array([0.4730762], np.float32),
                  model="demo-mlp", model_version="default/sha256:3ba5123c8b0d", attempts=1,
                  enqueued_at=T0, started_at=T0 + 0.004, finished_at=T0 + 0.0045,
                  queue_ms=4.0, compute_ms=0.5, batch_size=8)


def test_request_bytes_are_pinned() -> None:
    """§11: removing, renaming or retyping a key, or moving ``inputs`` off the end, bumps
    ``v``. The bytes of §9.1 are what this version writes and reads."""
    req = Request("req-0001", "demo-mlp", X, enqueued_at=T0, notify="c0ffee")
    assert encode_request(req) == REQUEST
    back = decode_request(REQUEST)
    assert (back.request_id, back.notify, back.notify_format, back.attempt) == (
        "req-0001", "c0ffee", None, 1)
    np.testing.assert_array_equal(back.inputs, X)  # type: ignore[arg-type]


def test_asking_for_bodies_adds_one_optional_key_before_inputs() -> None:
    """§11: an optional key with a default keeps ``v: 1``, and goes before ``inputs``.
    A request that does not ask (the §9.1 bytes) is read as asking for IDs alone."""
    req = Request("req-0001", "demo-mlp", X, enqueued_at=T0, notify="c0ffee",
                  notify_format=NOTIFY_RESULTS)
    assert encode_request(req) == REQUEST_ASKING
    assert decode_request(REQUEST_ASKING).notify_format == NOTIFY_RESULTS
    assert REQUEST_ASKING.index(b"notify_format") < REQUEST_ASKING.index(b"inputs")


def test_result_bytes_are_pinned() -> None:
    """§11: the result envelope's 15 keys, their order and types (§6.1, §9.3) change only
    with ``v``; ``model_version`` is ``label/sha256:…``."""
    assert encode_result(_succeeded()) == RESULT
    back = decode_result(RESULT)
    assert (back.status, back.model_version, back.batch_size) == (
        "succeeded", "default/sha256:3ba5123c8b0d", 8)


async def test_pending_record_is_pinned(redis_url: str) -> None:
    """§11: changing the record layout bumps ``v``. The pending record is the hash of
    §6.2: ``status``, ``gen``, ``body`` (§9.2's bytes) and ``notify``."""
    assert encode_result(Result("req-0001", "pending", model="demo-mlp",
                                enqueued_at=T0)) == PENDING
    store = open_result_store(redis_url, NAMES, ttl_s=86400)
    try:
        await store.put_pending([("req-0001", PENDING)], [Ownership(notify="c0ffee")])
        assert await store.redis.hgetall("bf:result:req-0001") == {
            b"status": b"pending", b"gen": b"0", b"body": PENDING, b"notify": b"c0ffee"}
        assert 0 < await store.redis.ttl("bf:result:req-0001") <= 86400
    finally:
        await store.close()


async def _messages(pubsub: Any, count: int) -> list[bytes]:
    """The data of the messages ``pubsub`` gets until ``count`` came, or 10 s passed."""
    got: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while len(got) < count and loop.time() < deadline:
        msg = await pubsub.get_message(timeout=0.5)
        if msg is not None:
            got.append(msg["data"])
    return got


async def test_announcement_bytes_are_pinned_for_each_format(redis_url: str) -> None:
    """§11 and §8: what a message on ``bf:notify:{client}`` carries is negotiated by the
    request (``notify_format``), never changed under a request that did not ask. Not
    asking gets the IDs, comma-joined, as clients written before one-hop delivery read
    them; ``results`` gets a msgpack array alternating ID (str) and body (bin)."""
    store = open_result_store(redis_url, NAMES)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("bf:notify:c0ffee")
        await store.write_terminal([
            TerminalWrite("req-0001", "succeeded", b"body-1", "c0ffee",
                          notify_format=NOTIFY_RESULTS),
            TerminalWrite("req-0002", "succeeded", b"body-2", "c0ffee"),
            TerminalWrite("req-0003", "failed", b"body-3", "c0ffee"),
        ])
        got = set(await _messages(pubsub, 2))
        pairs = bytes.fromhex("92a87265712d30303031c406626f64792d31")
        assert got == {pairs, b"req-0002,req-0003"}
        assert b"req-0002,req-0003".decode() == "req-0002,req-0003"  # what old clients do
        assert parse_announcement(pairs) == [("req-0001", b"body-1")]
        assert parse_announcement(b"req-0002,req-0003") == [("req-0002", None),
                                                             ("req-0003", None)]
    finally:
        await pubsub.aclose()
        await store.close()


async def test_an_announcement_rebuilt_after_a_lost_write_has_the_same_bytes(
        redis_url: str) -> None:
    """§8: the worker builds a batch's ``results`` message and Redis sends it as is when
    every write in it won; where one lost, Redis rebuilds it from the winners, and the
    bytes are those the worker would have built for them alone."""
    store = open_result_store(redis_url, NAMES)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("bf:notify:c0ffee")
        first = TerminalWrite("req-0010", "failed", b"first", "c0ffee")
        assert await store.write_terminal([first]) == [True]
        assert await store.write_terminal([
            TerminalWrite(rid, "succeeded", body, "c0ffee", notify_format=NOTIFY_RESULTS)
            for rid, body in (("req-0010", b"late"), ("req-0011", b"b" * 300),
                              ("req-0012", b"body-12"))]) == [False, True, True]
        got = await _messages(pubsub, 2)
        assert got == [b"req-0010", msgpack.packb(["req-0011", b"b" * 300,
                                                   "req-0012", b"body-12"])]
        assert got[1][:13] == bytes.fromhex("94a87265712d30303131c5012c")  # array, str, bin16
    finally:
        await pubsub.aclose()
        await store.close()


async def test_dead_letter_entry_is_pinned(redis_url: str) -> None:
    """§11: the stream layout ``bf:dlq:{model}`` (§2) is a record layout: its fields
    change only with ``v``; ``errors`` is msgpack, ``at`` and ``gen`` are text."""
    store = open_result_store(redis_url, NAMES)
    dlq = DeadLetterQueue(store.redis, NAMES)
    errors = [{"attempt": 1, "type": "model_error", "message": "boom", "at": T0}]
    try:
        added = await dlq.add([DeadLetter("req-0001", "demo-mlp", REQUEST, 1, errors,
                                          "max_attempts", dead_at=T0)])
        assert added == [Lettered.ADDED]
        [(_, fields)] = await store.redis.xrange("bf:dlq:demo-mlp")
        assert fields == {
            b"id": b"req-0001", b"model": b"demo-mlp", b"envelope": REQUEST,
            b"attempts": b"1",
            b"errors": bytes.fromhex("9184a7617474656d707401a474797065ab6d6f64656c5f6572726f72"
                                     "a76d657373616765a4626f6f6da26174cb41d954fc40000000"),
            b"reason": b"max_attempts", b"at": b"1700000000.0", b"gen": b"0"}
        assert await store.redis.smembers("bf:dlq:_models") == {b"demo-mlp"}
        [letter] = await dlq.list("demo-mlp")
        assert (letter.request_id, letter.errors, letter.dead_at) == ("req-0001", errors, T0)
    finally:
        await store.close()


def test_heartbeat_bytes_are_pinned() -> None:
    """§11 for ``bf:worker:{id}`` (schemas/heartbeat.py): a msgpack map stamped with its
    own layout ``v``; readers keep the fields they know and refuse only a newer major."""
    info = {"worker_id": "w-1", "host": "h", "started_at": T0, "seen_at": T0 + 10,
            "models": ["demo-mlp"]}
    golden = bytes.fromhex("86a17601a9776f726b65725f6964a3772d31a4686f7374a168aa737461727465"
                           "645f6174cb41d954fc40000000a77365656e5f6174cb41d954fc42800000a66d"
                           "6f64656c7391a864656d6f2d6d6c70")
    assert encode_heartbeat(info) == golden
    record = decode_heartbeat(golden)
    assert record is not None
    assert (record.worker_id, record.models, record.seen_at) == ("w-1", ("demo-mlp",), T0 + 10)
    newer = msgpack.packb({**info, "v": 2})
    assert decode_heartbeat(newer) is None  # a newer major layout is refused, not misread


def test_registry_record_values_are_pinned() -> None:
    """§11 for ``bf:model:{model}`` (§2 "Model registry"): each field's msgpack map keeps
    its keys and types; unknown fields are ignored, so adding one keeps the layout."""
    version = pack(ModelVersion("default", "sha256:3ba5123c8b0d",
                                TensorSpec("float32", (10,))).to_wire())
    assert version == bytes.fromhex(
        "83a776657273696f6eb37368613235363a336261353132336338623064a5696e70757482a564747970"
        "65a7666c6f61743332a57368617065910aa66f7574707574c0")
    served = encode_served(["default"], T0)
    assert served == bytes.fromhex("82a26174cb41d954fc40000000a66c6162656c7391a764656661756c74")
    policy = pack(RolloutPolicy("default").to_wire())
    assert policy == bytes.fromhex(
        "87a6737461626c65a764656661756c74a663616e617279c0a770657263656e74cb0000000000000000"
        "a6736861646f77c0a870726576696f7573c0a565706f636800a5677561726483ac6572726f725f706f"
        "696e7473cb4014000000000000a97039395f726174696fcb4000000000000000aa6d696e5f77696e64"
        "6f77ccc8")
    record = decode_record("demo-mlp", {
        b"version:default": version, b"served:w-1": served, b"policy": policy,
        b"lane_shards": b"1", b"some_later_field": b"ignored"})
    assert record is not None
    assert record.policy.stable == "default"
    assert record.versions["default"].version == "sha256:3ba5123c8b0d"
    assert record.served["w-1"].at == T0
