"""Versions and routing as pure functions: spec parsing, seeds, hashing, the split."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.schemas.envelopes import Request, decode_request, encode_request
from batchfleet.schemas.errors import ConfigError, ValidationError
from batchfleet.schemas.heartbeat import decode_heartbeat, encode_heartbeat
from batchfleet.schemas.names import Names
from batchfleet.schemas.registry import RolloutPolicy
from batchfleet.workers.middleware.routing import (
    BUCKETS,
    bucket,
    choose,
    serving,
    unknown_version,
)
from batchfleet.workers.models import lanes, load_versions, model_version, version_lane
from batchfleet.workers.models.loading import builtin_source, split_model_spec

pytestmark = pytest.mark.unit


def test_specs_carry_a_label_and_unlabelled_is_default() -> None:
    assert split_model_spec("demo-mlp").label == "default"
    spec = split_model_spec("demo-mlp@v2=demo-mlp:seed=2")
    assert (spec.name, spec.label, spec.source) == ("demo-mlp", "v2", "demo-mlp:seed=2")
    for bad in ("demo-mlp@=demo-mlp", "demo-mlp@v/2=demo-mlp", "@v2=demo-mlp"):
        with pytest.raises(ConfigError):
            split_model_spec(bad)
    assert builtin_source("demo-mlp:seed=2") == ("demo-mlp", 2)
    assert builtin_source("pkg.mod:make") is None
    with pytest.raises(ConfigError, match="seed=N"):
        builtin_source("demo-mlp:depth=3")


def test_a_seed_is_another_network_and_a_label_given_twice_is_refused() -> None:
    versions = load_versions(["demo-mlp", "demo-mlp@v2=demo-mlp:seed=2"], 8)
    first, second = versions["demo-mlp"]["default"], versions["demo-mlp"]["v2"]
    assert list(versions["demo-mlp"]) == ["default", "v2"]
    assert first.version != second.version and first.version.startswith("sha256:")
    assert model_version("v2", second) == f"v2/{second.version}"
    x = np.random.default_rng(0).random((4, 10), dtype=np.float32)
    out = [h.postprocess(h.predict(h.preprocess(list(x))), 4) for h in (first, second)]
    assert not np.allclose(np.asarray(out[0]), np.asarray(out[1]))
    with pytest.raises(ConfigError, match="version 'v2' is given twice"):
        load_versions(["demo-mlp@v2=demo-mlp", "demo-mlp@v2=demo-mlp:seed=3"], 8)


def test_routing_is_deterministic_and_the_split_follows_the_percent() -> None:
    policy = RolloutPolicy("default", "v2", 20.0, epoch=3)
    ids = [f"req-{i}" for i in range(10_000)]
    chosen = [choose(policy, rid) for rid in ids]
    assert chosen == [choose(policy, rid) for rid in ids]  # same on every worker, every time
    share = chosen.count("v2") / len(ids) * 100
    assert abs(share - 20.0) <= 2.0, share
    assert 0 <= bucket("x") < BUCKETS
    assert {choose(RolloutPolicy("default"), rid) for rid in ids[:100]} == {"default"}
    assert {choose(RolloutPolicy("a", "b", 100.0), rid) for rid in ids[:100]} == {"b"}
    assert serving(policy) == {"default", "v2"}
    assert serving(RolloutPolicy("default", shadow="v3")) == {"default"}


def test_a_routing_key_keeps_one_user_on_one_version() -> None:
    policy = RolloutPolicy("default", "v2", 50.0)
    assert len({choose(policy, "user-42") for _ in range(20)}) == 1


def test_unknown_version_names_the_versions_that_exist() -> None:
    error = unknown_version("demo-mlp", "v9", ["v2", "default"])
    assert error.type == "unknown_version" and not error.retryable
    assert "'v9'" in error.message and "default, v2" in error.message


def test_version_lanes_and_their_kafka_topics() -> None:
    assert version_lane("demo-mlp", "v2") == "demo-mlp@v2"
    assert lanes({"demo-mlp": {"default": object(), "v2": object()}}) == [  # type: ignore[dict-item]
        "demo-mlp", "demo-mlp@default", "demo-mlp@v2"]
    assert Names().topic("demo-mlp@v2", "interactive") == "bf.requests.demo-mlp.at.v2.interactive"


def test_the_envelope_carries_a_pin_and_a_routing_key() -> None:
    req = Request("r1", "demo-mlp", np.zeros(10, np.float32), version="v2", routing_key="u-1")
    back = decode_request(encode_request(req))
    assert (back.version, back.routing_key) == ("v2", "u-1")
    plain = decode_request(encode_request(Request("r2", "demo-mlp", np.zeros(10, np.float32))))
    assert (plain.version, plain.routing_key) == (None, None)
    with pytest.raises(ValidationError, match="version"):
        encode_request(Request("r3", "demo-mlp", np.zeros(10, np.float32), version="v/2"))


def test_the_heartbeat_reports_the_policy_epoch_applied() -> None:
    raw = encode_heartbeat({"worker_id": "w1", "policy_epochs": {"demo-mlp": 4},
                            "policy_applied_at": {"demo-mlp": 12.5}})
    record = decode_heartbeat(raw)
    assert record is not None
    assert record.policy_epochs == {"demo-mlp": 4}
    assert record.policy_applied_at == {"demo-mlp": 12.5}


def test_the_gateway_body_takes_a_pin_and_a_routing_key() -> None:
    from batchfleet.producers.gateway.bodies import parse_submission

    sub = parse_submission({"inputs": [0.0] * 10, "version": "v2", "routing_key": "u-1"},
                           batch=False, max_items=8)
    assert (sub.version, sub.routing_key) == ("v2", "u-1")
    plain = parse_submission({"inputs": [0.0] * 10}, batch=False, max_items=8)
    assert (plain.version, plain.routing_key) == (None, None)
    for bad in ({"version": "v/2"}, {"version": 3}, {"routing_key": ""}):
        with pytest.raises(ValidationError):
            parse_submission({"inputs": [0.0] * 10, **bad}, batch=False, max_items=8)


def test_a_version_can_differ_from_stable_only_in_its_runtime() -> None:
    """``--model demo-mlp@fast=demo-mlp --runtime demo-mlp@fast=onnx``: the per-version
    setting reaches only that version, and its results say so."""
    from batchfleet.workers.per_model import PerModel
    from batchfleet.workers.settings import WorkerSettings

    settings = WorkerSettings.from_url(
        "redis://h:1/0", models=("demo-mlp", "demo-mlp@fast=demo-mlp"),
        runtime=PerModel("eager", ((("demo-mlp", "fast"), "onnx"),))).validated()
    assert settings.model_names == ("demo-mlp",)
    versions = load_versions(settings.models, 8, settings.runtime_for)["demo-mlp"]
    base = versions["default"].version
    assert "/" not in base
    assert versions["fast"].version == f"{base}/onnx-fp32"
