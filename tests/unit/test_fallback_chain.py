"""The fallback chain grammar and its start-up checks: pure code, tested directly."""

from __future__ import annotations

import numpy as np
import pytest

from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.fallback.chain import (
    FallbackChain,
    Step,
    check_chain,
    check_value,
    parse_chain,
    parse_triggers,
)
from batchfleet.workers.models import TensorSpec


class _H:
    def __init__(self, dtype: str = "float32", shape: tuple[int, ...] = (10,)) -> None:
        self.input_spec = TensorSpec(dtype, shape)
        self.version = "sha256:x"


def test_a_chain_is_steps_joined_with_bars_and_brackets_keep_a_value_whole() -> None:
    chain = parse_chain("cache|model:backup@v1|rules:tests.support.fallback_rules:score|"
                        "value:[0.5,0.5]|fail")
    assert [s.name for s in chain.steps] == [
        "cache", "model:backup@v1", "rules:tests.support.fallback_rules:score", "value", "fail"]
    assert chain.steps[3].arg == "[0.5,0.5]"
    assert chain.active
    assert parse_chain("") == FallbackChain() and not parse_chain("fail").active


def test_the_steps_tried_stop_at_fail_skip_the_broken_model_and_keep_cheap_ones() -> None:
    chain = parse_chain("model:m|model:backup|value:[1]|fail|rules:a:b")
    assert [s.name for s in chain.answering()] == ["model:m", "model:backup", "value"]
    assert [s.name for s in chain.answering(skip_model="m")] == ["model:backup", "value"]
    assert [s.name for s in chain.answering(cheap_only=True)] == ["value"]


@pytest.mark.parametrize(("text", "says"), [
    ("valu:[1]", "unknown step"),
    ("value:[1", "not JSON"),
    ("rules:nomodule", "rules:module:function"),
    ("model:", "needs an argument"),
    ("cache:x", "takes no argument"),
    ("value:[1]|value:[1]", "repeats a step"),
])
def test_a_malformed_chain_is_refused_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_chain(text)


def test_triggers_are_joined_with_plus_and_default_to_all() -> None:
    assert parse_triggers("all") == parse_triggers("") == {"error", "breaker", "deadline",
                                                          "overload"}
    assert parse_triggers("error+breaker") == {"error", "breaker"}
    assert parse_triggers("none") == frozenset()
    with pytest.raises(ValueError, match="unknown trigger"):
        parse_triggers("error+typo")


@pytest.mark.parametrize(("chain", "says"), [
    ("model:ghost", "does not hold 'ghost'"),
    ("model:backup@v9", "does not hold 'backup@v9'"),
    ("model:wide", "input spec float32[20] differs from m's float32[10]"),
    ("model:m", "cannot fall back on its own version"),
    ("rules:tests.support.no_such_module:f", "cannot import"),
    ("rules:tests.support.fallback_rules:nope", "has no function 'nope'"),
    ("cache", "needs the result cache"),
])
def test_every_start_up_refusal_is_one_line_naming_model_and_step(chain: str, says: str) -> None:
    versions = {"m": {"default": _H()}, "backup": {"default": _H()},
                "wide": {"default": _H(shape=(20,))}}
    with pytest.raises(ConfigError) as info:
        check_chain("m", parse_chain(chain), versions, cache_on=False)
    message = str(info.value)
    assert says in message and "\n" not in message and message.startswith("--fallback m=")


def test_a_good_chain_passes_and_another_version_of_the_model_is_allowed() -> None:
    versions = {"m": {"v2": _H(), "v1": _H()}}
    check_chain("m", parse_chain("model:m@v1|rules:tests.support.fallback_rules:score|"
                                 "value:[0.5]"), versions, cache_on=False)


def test_a_value_takes_the_model_output_dtype_and_must_have_its_shape() -> None:
    step = Step("value", "[0.5]")
    out = check_value("m", step, np.zeros(1, np.float32))
    assert out.dtype == np.float32 and out.tolist() == [0.5]
    with pytest.raises(ConfigError, match=r"shape \[2\] differs from the model's output shape "
                                          r"\[1\]"):
        check_value("m", Step("value", "[0.5,0.5]"), np.zeros(1, np.float32))
    with pytest.raises(ConfigError, match="do not fit the model's output dtype int64"):
        check_value("m", Step("value", "[0.5]"), np.zeros(1, np.int64))
    assert check_value("m", step, None).dtype == np.float32  # unknown: taken as given


def test_a_draining_model_pauses_again_once_its_chain_leaves_a_batch_held() -> None:
    """The breaker trigger keeps an open breaker's lane pulled only while the chain answers:
    a held batch (the chain could not answer it) pauses the lane as before, so fetched
    work stays bounded."""
    from batchfleet.workers.breaker import BreakerConfig
    from batchfleet.workers.guards import Guards
    from batchfleet.workers.middleware.base import Batch, BatchKey

    now = [0.0]
    guards = Guards(BreakerConfig(consecutive_failures=1, cooldown_s=60),
                    BreakerConfig(), ["m"], clock=lambda: now[0])
    guards.model["m"].record_failure()
    assert guards.paused_models() == {"m"}
    guards.draining = frozenset({"m"})
    assert guards.paused_models() == frozenset() and guards.answering_around("m")
    guards.hold("m", Batch(BatchKey(0, "m", None), []))
    assert guards.paused_models() == {"m"}
    now[0] = 61.0  # half-open: the probe is available, so nothing answers around it
    assert not guards.answering_around("m")


def test_a_chain_is_per_model_and_a_version_entry_is_refused_in_one_line() -> None:
    from batchfleet.schemas.per_model import parse_per_model
    from batchfleet.workers.fallback.chain import check_chain_text
    from batchfleet.workers.settings import WorkerSettings

    chains = parse_per_model(["demo-mlp@v2=value:[0.5]"], check_chain_text, "")
    with pytest.raises(ConfigError, match="per model, not per version") as info:
        WorkerSettings.from_url("redis://localhost:6379/0", fallback=chains)
    assert "\n" not in str(info.value) and "demo-mlp@v2" in str(info.value)
