"""The fleet's guarantees on a faster runtime: demo-encoder and demo-mlp on ONNX Runtime.

CI runs ONNX fp32 and int8 (compile costs ~20 s of start-up per bucket set on this CPU;
``bench --runtimes`` measures it). The bad-input table mirrors
tests/e2e/test_pipeline.py::test_every_kind_of_bad_input_gets_a_terminal_result_naming_it
for the inputs a runtime can change: validation at intake, and a row that fails inside the
ONNX graph (an out-of-vocabulary token with no intake check) isolated by bisection.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from batchfleet.workers.models import TensorSpec, TorchModuleHandler, build_encoder
from batchfleet.workers.models.builtin import ENCODER_SEQ_LEN
from batchfleet.workers.per_model import parse_per_model
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

FAST = ("demo-mlp", "demo-encoder", "raw")


def raw_encoder() -> TorchModuleHandler:
    """demo-encoder without its token-range check: a bad token fails inside the model."""
    return TorchModuleHandler("raw", build_encoder(),
                              input_spec=TensorSpec("int64", (ENCODER_SEQ_LEN,)),
                              input_range=(0, 1024), max_batch_size=8)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
async def test_bad_input_table_on_onnx(redis_url: str, precision: str) -> None:
    from batchfleet.producers import AsyncClient

    runtime = parse_per_model([f"{m}=onnx" for m in FAST], str, "eager")
    async with running_worker(
        redis_url, models=("demo-mlp", "demo-encoder", "raw=tests.e2e.test_runtimes:raw_encoder",
                           "poison=tests.support.models:poison_model"),
        runtime=runtime, precision=parse_per_model([f"{m}={precision}" for m in FAST], str,
                                                   "fp32"),
        max_batch_size=8, max_attempts=1,
    ) as worker, AsyncClient(redis_url) as client:
        rng = np.random.default_rng(3)
        tokens = rng.integers(0, 1024, (12, ENCODER_SEQ_LEN), dtype=np.int64)
        good = await client.submit_many("demo-encoder", tokens)
        mlp = await client.submit_many("demo-mlp", np.full((5, 10), 0.5, np.float32))
        wrong_dtype = await client.submit("demo-encoder", tokens[0].astype(np.float32))
        wrong_shape = await client.submit("demo-encoder", tokens[0, :10])
        named = await client.submit("demo-encoder", {"x": tokens[0]})
        out_of_vocab = await client.submit("demo-encoder", np.full(ENCODER_SEQ_LEN, 5000))
        inside = tokens[:6].copy()
        inside[2, 7] = 99_999  # no intake check on "raw": fails inside the ONNX graph
        raw = await client.submit_many("raw", inside)
        ids = [wrong_dtype, wrong_shape, named, out_of_vocab]
        res = dict(zip(ids, await client.wait_many(ids, timeout=60), strict=True))
        good_res = await client.wait_many(good, timeout=60)
        mlp_res = await client.wait_many(mlp, timeout=60)
        raw_res = await client.wait_many(raw, timeout=60)
        info = worker.vitals()["runtimes"]["demo-encoder"]  # what heartbeat/status show
        exposition = worker.metrics.exposition().decode()
        assert worker.ready.is_set()

    def error(rid: str) -> tuple[str, str]:
        r = res[rid]
        assert r.status == "failed" and r.error is not None, r
        return r.error.type, r.error.message

    assert error(wrong_dtype)[1].startswith("wrong dtype: expected int64, got float32")
    assert error(wrong_shape)[1].startswith("wrong shape: expected int64[64]")
    assert "named tensors" in error(named)[1]
    assert error(out_of_vocab)[0] == "validation_error" and "token IDs" in error(out_of_vocab)[1]
    # every good request succeeded, stamped with the runtime, close to eager fp32
    assert {r.status for r in good_res + mlp_res} == {"succeeded"}
    assert {r.model_version.rsplit("/", 1)[1] for r in good_res} == {f"onnx-{precision}"}
    with torch.inference_mode():
        want = build_encoder()(torch.from_numpy(tokens)).numpy()
    got = np.stack([r.outputs for r in good_res])
    assert np.abs(got - want).max() <= (1e-4 if precision == "fp32" else 0.1)
    assert info["accuracy"]["rows"] >= 256 and info["precision"] == precision
    gauge = (f'batchfleet_model_accuracy_diff{{model="demo-encoder",stat="max_abs"}} '
             f'{info["accuracy"]["max_abs"]}')
    assert gauge in exposition
    # bisection isolates the one bad row inside the runtime; its five neighbours are served
    statuses = [r.status for r in raw_res]
    assert statuses.count("failed") == 1 and statuses[2] == "failed", statuses
