"""Producer -> Redis Stream -> micro-batched model -> result store, with an in-process worker."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
import torch

from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers import AsyncClient, Client
from batchfleet.schemas import Request, encode_request
from batchfleet.schemas.errors import RequestConflictError, UnknownModelError
from batchfleet.workers.models import build_encoder, build_mlp
from tests.support.fleet import running_worker
from tests.support.models import POISON
from tests.support.transports import Fleet

pytestmark = pytest.mark.e2e


def _local(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


async def test_both_models_end_to_end_match_the_model_run_locally(fleet: Fleet) -> None:
    rng = np.random.default_rng(1)
    mlp_x = rng.random((50, 10), dtype=np.float32)
    enc_x = rng.integers(0, 1024, (6, 64), dtype=np.int64)
    async with fleet.worker(models=("demo-mlp", "demo-encoder")), fleet.client() as client:
        mlp_ids = await client.submit_many("demo-mlp", mlp_x)
        enc_ids = await client.submit_many("demo-encoder", enc_x)
        mlp = await client.wait_many(mlp_ids, timeout=30)
        enc = await client.wait_many(enc_ids, timeout=30)
    assert {r.status for r in mlp + enc} == {"succeeded"}
    np.testing.assert_allclose(np.stack([r.outputs for r in mlp]), _local(build_mlp(), mlp_x),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.stack([r.outputs for r in enc]),
                               _local(build_encoder(), enc_x), rtol=1e-4, atol=1e-5)
    first = mlp[0]
    assert first.model == "demo-mlp" and first.model_version.startswith("default/sha256:")
    assert first.attempts == 1 and first.batch_size and first.batch_size >= 1
    assert first.started_at and first.finished_at and first.started_at <= first.finished_at
    assert first.queue_ms is not None and first.compute_ms is not None


async def test_ten_thousand_requests_each_get_exactly_one_terminal_result(fleet: Fleet) -> None:
    n = 10_000
    x = np.random.default_rng(2).random((n, 10), dtype=np.float32)
    async with fleet.worker(max_batch_size=128) as worker, fleet.client() as client:
        ids = await client.submit_many("demo-mlp", x)
        results = await client.wait_many(ids, timeout=120)
    assert len(set(ids)) == n
    assert [r.request_id for r in results] == ids
    assert all(r.status == "succeeded" for r in results)
    stats = worker.stats
    assert stats.succeeded == n and stats.duplicates == 0 and stats.failed == 0
    assert stats.batches < n / 4  # it really batched
    if fleet.kind == "redis":
        names, redis = fleet.names, redis_client(fleet.broker)
        try:  # nothing left behind: every entry acked and deleted
            assert await redis.xlen(names.stream("demo-mlp", "interactive")) == 0
            assert (await redis.xpending(names.stream("demo-mlp", "interactive"),
                                         names.consumer_group))["pending"] == 0
        finally:
            await redis.aclose()


async def test_sync_client_and_duplicate_submits_never_overwrite(fleet: Fleet) -> None:
    async with fleet.worker():
        def use_sync_client() -> tuple[object, object, object]:
            with Client(fleet.broker, fleet.results, namespace=fleet.namespace) as client:
                rid = client.submit("demo-mlp", [0.1] * 10, request_id="order-42")
                first = client.wait(rid, timeout=10)
                again = client.submit("demo-mlp", [0.1] * 10, request_id="order-42")
                # the same ID with other inputs is refused, never run over the first
                with pytest.raises(RequestConflictError):
                    client.submit("demo-mlp", [0.9] * 10, request_id="order-42")
                return rid, again, (first, client.wait(rid, timeout=10), client.get("none"))

        rid, again, (first, second, unknown) = await asyncio.to_thread(use_sync_client)
    assert rid == again == "order-42"
    assert first.status == "succeeded" and second.outputs == first.outputs  # type: ignore[attr-defined]
    assert unknown is None


async def test_every_kind_of_bad_input_gets_a_terminal_result_naming_it(fleet: Fleet) -> None:
    async with fleet.worker(
        models=("demo-mlp", "poison=tests.support.models:poison_model",
                "short=tests.support.models:wrong_count_model"),
        max_message_bytes=64 * 1024, max_attempts=1,
    ) as worker, fleet.client() as client:
        good = await client.submit_many("demo-mlp", np.full((20, 10), 0.5, np.float32))
        wrong_dtype = await client.submit("demo-mlp", np.zeros(10, np.float64))
        wrong_shape = await client.submit("demo-mlp", np.zeros((3, 4), np.float32))
        named = await client.submit("demo-mlp", {"x": np.zeros(10, np.float32)})
        huge = await client.submit("demo-mlp", np.zeros(100_000, np.float32))
        rows = np.full((16, 10), 0.5, np.float32)
        rows[5, 0] = POISON
        poisoned = await client.submit_many("poison", rows)
        short = await client.submit("short", np.zeros(10, np.float32))
        # hand-made messages a non-Python producer might send
        body = {"v": 1, "id": "not-a-tensor", "model": "demo-mlp", "inputs": "hello"}
        await fleet.raw_publish("demo-mlp", msgpack.packb(body))
        ghost = {"v": 1, "id": "ghost-model", "model": "ghost",
                 "inputs": {"dtype": "float32", "shape": [10], "data": b"\0" * 40}}
        await fleet.raw_publish("demo-mlp", msgpack.packb(ghost))
        whole = encode_request(Request("truncated", "demo-mlp", np.zeros(10, np.float32)))
        await fleet.raw_publish("demo-mlp", whole[:-7])
        await fleet.raw_publish("demo-mlp", b"\xc1 total garbage")
        ids = [wrong_dtype, wrong_shape, named, huge, short, "not-a-tensor", "ghost-model",
               "truncated"]
        res = dict(zip(ids, await client.wait_many(ids, timeout=30), strict=True))
        good_res = await client.wait_many(good, timeout=30)
        poison_res = await client.wait_many(poisoned, timeout=30)
        redis = redis_client(fleet.results)
        try:  # the garbage has no result to wait for: wait for its dead letter instead
            for _ in range(100):
                if dead := await redis.xrange(fleet.names.undecodable_stream):
                    break
                await asyncio.sleep(0.1)
        finally:
            await redis.aclose()
        assert worker.ready.is_set() and worker.stats.undecodable == 1  # still running

    def error(rid: str) -> tuple[str, str]:
        r = res[rid]
        assert r.status == "failed" and r.error is not None, r
        return r.error.type, r.error.message

    assert error(wrong_dtype) == ("validation_error",
                                  "wrong dtype: expected float32, got float64")
    assert error(wrong_shape)[1].startswith("wrong shape: expected float32[10]")
    assert "named tensors" in error(named)[1]
    assert error(huge)[0] == "limit_exceeded" and "limit is 65536" in error(huge)[1]
    assert error(short)[0] == "output_mismatch"
    assert "expected a tensor map" in error("not-a-tensor")[1]
    assert error("ghost-model")[1] == ("request names model 'ghost' but was published to the "
                                       "'demo-mlp' lane")
    assert error("truncated")[0] == "decode_error"
    assert all(r.status == "succeeded" for r in good_res)
    # the poisoned batch was bisected: one failure, fifteen neighbours served
    statuses = [r.status for r in poison_res]
    assert statuses.count("failed") == 1 and statuses[5] == "failed"
    assert poison_res[5].error is not None and "poison input" in poison_res[5].error.message
    assert len(dead) == 1 and dead[0][1][b"raw"] == b"\xc1 total garbage"
    assert b"not a msgpack envelope" in dead[0][1][b"reason"]


async def test_unknown_models_are_refused_at_submit(redis_url: str) -> None:
    async with running_worker(redis_url), AsyncClient(redis_url) as client:
        with pytest.raises(UnknownModelError, match=r"'nope' \(known models: demo-mlp\)"):
            await client.submit("nope", [0.0] * 10)


async def test_expired_requests_are_answered_without_compute(fleet: Fleet) -> None:
    # submitted before any worker exists, so the model cannot be checked yet
    async with fleet.client(check_model=False) as client:
        rid = await client.submit("demo-mlp", [0.0] * 10, deadline_s=0.05)
        live = await client.submit("demo-mlp", [0.0] * 10, deadline_s=60)
        await asyncio.sleep(0.1)
        async with fleet.worker() as worker:
            expired, ok = await client.wait_many([rid, live], timeout=10)
            computed = worker.stats.computed
    assert expired.status == "expired" and expired.error is not None
    assert expired.error.type == "deadline_exceeded" and expired.outputs is None
    assert ok.status == "succeeded" and computed == 1
