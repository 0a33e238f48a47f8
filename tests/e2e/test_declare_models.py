"""Deploy order: models declared ahead of their workers (docs/operations.md, "Deploy order").

A declared model accepts submits from every front door (SDK, CLI, gateway) before
any worker exists; they wait in the lane and succeed once one starts. A declared
input spec refuses a wrong shape at submit, and an unknown model's refusal gives
advice that fits the interface it is shown in.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from batchfleet.connectors.model_registry import open_model_registry
from batchfleet.connectors.redis_client import redis_client
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import UnknownModelError, ValidationError
from batchfleet.schemas.names import LANE_INTERACTIVE, Names
from batchfleet.schemas.registry import Declaration, TensorSpec
from tests.e2e.test_gateway import AUTH
from tests.e2e.test_gateway import settings as gateway_settings
from tests.support.cli import run_cli
from tests.support.fleet import running_worker
from tests.support.gateway_main import live_gateway

pytestmark = pytest.mark.e2e
NS = "decl"
ROW = [0.5] * 10


def _at(redis_url: str) -> tuple[str, ...]:
    return ("--broker", redis_url, "--namespace", NS)


async def test_declared_model_takes_submits_before_any_worker(redis_url: str) -> None:
    code, out, err = await run_cli("models", "declare", "fraud", "--input", "float32[10]",
                                "--output-spec", "float32[1]", *_at(redis_url))
    assert code == 0 and "declared fraud (float32[10])" in out, err
    async with AsyncClient(redis_url, namespace=NS) as client:
        sdk_id = await client.submit("fraud", ROW)
        code, out, err = await run_cli("submit", "-m", "fraud", "--inputs", json.dumps(ROW),
                                    "--json", *_at(redis_url))
        assert code == 0, err
        cli_id = json.loads(out)["request_id"]
        with live_gateway(gateway_settings(redis_url, namespace=NS)) as base:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                accepted = await http.post("/v1/models/fraud/requests", json={"inputs": ROW},
                                           headers=AUTH)
        assert accepted.status_code == 202, accepted.text
        ids = [sdk_id, cli_id, accepted.json()["request_id"]]
        waiting = [await client.get(rid) for rid in ids]
        assert [r.status for r in waiting if r is not None] == ["pending"] * 3
        async with running_worker(redis_url, namespace=NS, models=("fraud=demo-mlp",)):
            done = await client.wait_many(ids, timeout=30)
    assert [r.status for r in done] == ["succeeded"] * 3
    assert all(r.model == "fraud" and r.model_version.startswith("default/sha256:") for r in done)


async def test_a_declared_spec_refuses_a_wrong_shape_at_submit(redis_url: str) -> None:
    code, _, err = await run_cli("models", "declare", "fraud", "--input", "float32[10]",
                              *_at(redis_url))
    assert code == 0, err
    async with AsyncClient(redis_url, namespace=NS) as client:
        with pytest.raises(ValidationError, match=r"wrong shape: expected float32\[10\]"):
            await client.submit("fraud", [0.5] * 9)
        with pytest.raises(ValidationError, match="wrong dtype: expected float32, got int64"):
            await client.submit_many("fraud", [[1] * 10])
    code, _, err = await run_cli("submit", "-m", "fraud", "--inputs", json.dumps([0.5] * 3),
                              *_at(redis_url))
    assert code == 2 and "wrong shape: expected float32[10]" in err
    with live_gateway(gateway_settings(redis_url, namespace=NS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            refused = await http.post("/v1/models/fraud/requests", json={"inputs": [0.5] * 11},
                                      headers=AUTH)
    assert refused.status_code == 422 and "wrong shape" in refused.json()["error"]["message"]
    probe = redis_client(redis_url)
    try:  # nothing was enqueued or recorded
        assert await probe.xlen(Names(NS).stream("fraud", LANE_INTERACTIVE)) == 0
        assert await probe.dbsize() == 2  # the index set and fraud's record
    finally:
        await probe.aclose()


async def test_models_list_show_and_undeclare_of_a_served_model(redis_url: str) -> None:
    registry = open_model_registry(redis_url, Names(NS))
    async with running_worker(redis_url, namespace=NS, models=("demo-mlp",)) as worker:
        code, _, err = await run_cli("models", "declare", "demo-mlp", "--input", "float32[10]",
                                  *_at(redis_url))
        assert code == 0, err
        await registry.declare("later", Declaration(time.time(), TensorSpec.parse("int64[4]")))
        code, out, err = await run_cli("models", "list", "--json", *_at(redis_url))
        assert code == 0, err
        listed = {m["name"]: m for m in json.loads(out)}
        assert set(listed) == {"demo-mlp", "later"}
        served = listed["demo-mlp"]
        assert served["versions"]["default"]["version"].startswith("sha256:")
        assert served["versions"]["default"]["input"] == {"dtype": "float32", "shape": [10]}
        assert served["declared"]["input"] == {"dtype": "float32", "shape": [10]}
        assert [(s["worker"], s["live"]) for s in served["served"]] == [
            (worker.settings.worker_id, True)]
        assert (served["policy"]["stable"], served["policy"]["epoch"]) == ("default", 0)
        assert served["lane_shards"] == 1
        assert listed["later"]["served"] == [] and listed["later"]["versions"] == {}
        assert listed["later"]["declared"]["input"] == {"dtype": "int64", "shape": [4]}
        code, out, _ = await run_cli("models", "undeclare", "demo-mlp", *_at(redis_url))
        assert code == 0 and "stays listed" in out
        code, out, _ = await run_cli("models", "show", "demo-mlp", "--json", *_at(redis_url))
        shown = json.loads(out)
        assert shown["declared"] is None and shown["served"][0]["live"] is True
        code, out, _ = await run_cli("models", "undeclare", "later", *_at(redis_url))
        assert code == 0 and "removed later" in out
        assert await registry.names() == {"demo-mlp"}
        code, _, err = await run_cli("models", "show", "later", *_at(redis_url))
        assert code == 1 and "batchfleet models declare later --input" in err
    await registry.close()


async def test_unknown_model_advice_fits_each_interface(redis_url: str) -> None:
    async with AsyncClient(redis_url, namespace=NS) as client:
        with pytest.raises(UnknownModelError) as sdk:
            await client.submit("nope", ROW)
    assert "check_model=False" in str(sdk.value)
    assert "batchfleet models declare nope --input" in str(sdk.value)
    code, _, err = await run_cli("submit", "-m", "nope", "--inputs", json.dumps(ROW),
                              *_at(redis_url))
    assert code == 2 and "batchfleet models declare nope --input" in err
    assert "check_model" not in err
    with live_gateway(gateway_settings(redis_url, namespace=NS)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            gone = await http.post("/v1/models/nope/requests", json={"inputs": ROW},
                                   headers=AUTH)
    assert gone.status_code == 404
    error = gone.json()["error"]
    assert error["type"] == "unknown_model"
    assert "batchfleet models declare nope --input" in error["message"]
    assert "check_model" not in error["message"]
