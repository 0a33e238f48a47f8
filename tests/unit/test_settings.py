"""One source of configuration: the settings fields generate the worker's options.

The generated-options test walks the settings dataclasses and the click parameters
typer built from them: every field has a flag and a ``BATCHFLEET_*`` variable, and the
defaults --help, --print-config and the README show are the dataclass's own. The
per-model parser is pure and tested from a table.
"""

from __future__ import annotations

from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.cli_worker import OPTIONS, config_table, redact, resolve, with_table
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.per_model import PerModel, parse_per_model, split_entry
from batchfleet.workers.retry import RetryConfig
from batchfleet.workers.settings import (
    KafkaSettings,
    ProcessSettings,
    WorkerSettings,
    format_value,
    setting_options,
)

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"
#: Names infra/ and the docs use: they must never change (tests/unit/test_infra.py).
STABLE_ENV = {"BATCHFLEET_BROKER", "BATCHFLEET_RESULTS", "BATCHFLEET_MODELS",
              "BATCHFLEET_NAMESPACE", "BATCHFLEET_DEVICE", "BATCHFLEET_KAFKA_PARTITIONS",
              "BATCHFLEET_KAFKA_SESSION_TIMEOUT_MS", "BATCHFLEET_GRACE_S",
              "BATCHFLEET_METRICS_PORT", "BATCHFLEET_LOG_FORMAT", "BATCHFLEET_WORKER_ID",
              "BATCHFLEET_MAX_BATCH_SIZE", "BATCHFLEET_MAX_WAIT_MS", "BATCHFLEET_TORCH_THREADS"}


def _leaf_names(cls: type[Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for f in fields(cls):
        if f.name == "kafka":
            out |= _leaf_names(KafkaSettings, "kafka_")
        else:
            out.add(prefix + f.name)
    return out


def _worker_params() -> dict[str, Any]:
    group = typer.main.get_command(app)
    command = group.commands["worker"]  # type: ignore[attr-defined]
    ctx = command.make_context("worker", ["--help"], resilient_parsing=True)
    return {p.name: p for p in command.get_params(ctx)}


def _print_config(*args: str, env: dict[str, str] | None = None) -> list[str]:
    # only the variables the test sets: none leak in from the shell running the tests
    clean: dict[str, str | None] = {o.env: None for o in OPTIONS}
    result = CliRunner().invoke(app, ["worker", *args, "--print-config"],
                                env=clean | (env or {}))
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


# --- the generated options ------------------------------------------------------------


def test_every_settings_field_has_a_flag_an_env_name_and_its_own_default() -> None:
    options = {o.name: o for o in OPTIONS}
    assert set(options) == _leaf_names(WorkerSettings) | _leaf_names(ProcessSettings)
    envs = [o.env for o in OPTIONS]
    assert len(set(envs)) == len(envs) and all(e.startswith("BATCHFLEET_") for e in envs)
    assert set(envs) >= STABLE_ENV
    assert options["kafka_partitions"].flag == "--kafka-partitions"
    assert options["kafka_session_timeout_ms"].flag == "--kafka-session-timeout-ms"

    params = _worker_params()
    for option in OPTIONS:
        param = params[option.name]
        assert option.flag in param.opts, option.name
        assert param.envvar == option.env, option.name
        # the option itself defaults to "not given"; the dataclass default is what it shows
        assert param.default in (None, ()), option.name
        if option.default is not MISSING and not option.opt.show:
            assert param.show_default == format_value(option.default), option.name
    assert "-m" in params["models"].opts and params["models"].multiple
    assert params["retry"].multiple


def test_nothing_given_resolves_to_the_dataclass_defaults() -> None:
    settings, process = resolve({"broker": "redis://h:1/0"})
    expected = WorkerSettings.from_url("redis://h:1/0", worker_id=settings.worker_id)
    assert settings == expected and process == ProcessSettings()
    for option in setting_options(WorkerSettings):
        if option.default is not MISSING:
            assert option.get(settings) == option.default, option.name


def test_print_config_defaults_match_the_dataclass() -> None:
    lines = dict(line.split(" = ", 1) for line in _print_config("--broker", "redis://h:1/0")
                 if "[" not in line.split(" = ", 1)[0])
    for option in OPTIONS:
        if option.default is not MISSING:
            shown = format_value(option.default) or option.opt.show
            assert lines[option.name].startswith(f"{shown}  # default"), option.name


def test_flag_beats_env_beats_default() -> None:
    env = {"BATCHFLEET_BROKER": "redis://h:1/0", "BATCHFLEET_MAX_BATCH_SIZE": "32",
           "BATCHFLEET_GRACE_S": "7", "BATCHFLEET_KAFKA_PARTITIONS": "8",
           "BATCHFLEET_WEBHOOK_RETRY_INTERVALS": "1,2"}
    lines = _print_config("--max-batch-size", "16", "--no-webhooks", env=env)
    assert "max_batch_size = 16  # flag --max-batch-size" in lines
    assert "grace_s = 7.0  # env BATCHFLEET_GRACE_S" in lines
    assert "kafka_partitions = 8  # env BATCHFLEET_KAFKA_PARTITIONS" in lines
    assert "webhook_retry_intervals = 1,2  # env BATCHFLEET_WEBHOOK_RETRY_INTERVALS" in lines
    assert "webhooks = false  # flag --webhooks" in lines
    assert "max_wait_ms = 5.0  # default" in lines


def test_print_config_redacts_passwords_and_shows_per_model_values() -> None:
    env = {"BATCHFLEET_RETRY": "demo-mlp=5:0.1,demo-encoder=2"}
    lines = _print_config("--broker", "redis://:secret@h:1/0", "-m", "demo-mlp",
                          "-m", "demo-encoder", "--webhook-redis-url",
                          "redis://user:hunter2@w:2/0", env=env)
    text = "\n".join(lines)
    assert "secret" not in text and "hunter2" not in text
    assert "broker = redis://:***@h:1/0  # flag --broker" in lines
    assert "webhook_redis_url = redis://user:***@w:2/0  # flag --webhook-redis-url" in lines
    assert "retry = demo-mlp=5:0.1,demo-encoder=2  # env BATCHFLEET_RETRY" in lines
    assert "retry[demo-mlp] = 5:0.1" in lines and "retry[demo-encoder] = 2" in lines
    # a field marked opt(secret=True) is hidden whole
    device = next(o for o in OPTIONS if o.name == "device")
    assert redact(replace(device, opt=replace(device.opt, secret=True)), "tok") == "***"
    assert redact(device, "rediss://u:p@h/0 and redis://h/0") == "rediss://u:***@h/0 and redis://h/0"


def test_bad_values_fail_in_one_line_naming_the_flag() -> None:
    runner = CliRunner()
    cases = [(["--max-batch-size", "many"], "--max-batch-size 'many': expected an integer"),
             (["--retry", "nope=3"], "it serves: demo-mlp"),
             (["--retry", "demo-mlp=0"], "--retry 'demo-mlp=0'"),
             (["--retry", "=3"], "expected VALUE or MODEL[@VERSION]=VALUE")]
    for args, message in cases:
        result = runner.invoke(app, ["worker", "--broker", "redis://h:1/0", *args,
                                     "--print-config"], env={o.env: None for o in OPTIONS})
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output, result.output


def test_the_readme_table_is_generated_from_the_fields() -> None:
    readme = README.read_text()
    assert config_table() in readme, "README is stale: run make readme-table"
    assert with_table(readme) == readme
    for option in OPTIONS:
        assert f"`{option.env}`" in readme and f"`{option.flag}`" in readme


# --- transport settings and the old flat names -----------------------------------------


def test_kafka_settings_are_nested_and_the_flat_names_still_work() -> None:
    settings = WorkerSettings.from_url("redis://h:1/0", kafka_partitions=8,
                                       kafka_session_timeout_ms=6000)
    assert settings.kafka == KafkaSettings(partitions=8, session_timeout_ms=6000)
    assert (settings.kafka_partitions, settings.kafka_session_timeout_ms) == (8, 6000)
    assert settings.replace(max_batch_size=2).kafka == settings.kafka


# --- per-model values -------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "model", "version", "expected"), [
    ([], "a", None, 7),
    (["3"], "a", None, 3),
    (["a=4"], "a", None, 4),
    (["a=4"], "b", None, 7),
    (["3", "a=4"], "b", None, 3),
    (["a=4", "3"], "a", "v1", 4),            # the model's entry wins over a later bare value
    (["a=4", "a@v2=5"], "a", "v2", 5),       # the version's entry wins over the model's
    (["a=4", "a@v2=5"], "a", "v1", 4),
    (["a@v2=5"], "a", None, 7),
    (["a=4", "a=6"], "a", None, 6),          # later entries win, as later flags do
    ([" a = 4 ", ""], "a", None, 4),
    (["my.model_v2-x=9"], "my.model_v2-x", None, 9),
])
def test_per_model_resolution(entries: list[str], model: str, version: str | None,
                              expected: int) -> None:
    resolved = parse_per_model(entries, int, 7, "--flag")
    assert resolved.for_model(model, version) == expected


@pytest.mark.parametrize(("entry", "message"), [
    ("=3", "expected VALUE or MODEL[@VERSION]=VALUE"),
    ("a b=3", "expected VALUE or MODEL[@VERSION]=VALUE"),
    ("a@=3", "expected VALUE or MODEL[@VERSION]=VALUE"),
    ("a=", "no value after '='"),
    ("a=x", "--flag 'a=x': invalid literal"),
    ("x", "--flag 'x': invalid literal"),
])
def test_malformed_per_model_entries_are_refused(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_per_model([entry], int, 7, "--flag")


def test_bare_values_that_hold_colons_or_urls_are_not_entries() -> None:
    assert split_entry("5:0.2:10") == (None, "5:0.2:10")
    assert split_entry("redis://h:1/0?a=b") == (None, "redis://h:1/0?a=b")
    assert split_entry("enc@v3=2:0.1") == (("enc", "v3"), "2:0.1")


def test_unknown_models_are_refused_at_start_up_naming_the_served_ones() -> None:
    per_model = PerModel(1, ((("enc", None), 2), (("typo", "v1"), 3)))
    with pytest.raises(ConfigError, match=r"--x names 'typo', which this worker does not "
                                          r"serve \(it serves: demo-mlp, enc\)"):
        per_model.check_models(["enc", "demo-mlp"], "--x")
    with pytest.raises(ConfigError, match="it serves: demo-mlp"):
        WorkerSettings.from_url("redis://h:1/0", retry=PerModel("", ((("enc", None), "2"),)))


def test_retry_keeps_its_syntax_and_meaning() -> None:
    retry = parse_per_model(["demo-encoder=5:0.2:10", "fraud=2"], str, "", "--retry")
    settings = WorkerSettings.from_url(
        "redis://h:1/0", models=("demo-mlp", "demo-encoder", "fraud=pkg.m:build"),
        max_attempts=4, retry_base_s=0.1, retry_cap_s=9.0, retry=retry)
    assert settings.retry_for("demo-mlp") == RetryConfig(4, 0.1, 9.0)
    assert settings.retry_for("demo-encoder") == RetryConfig(5, 0.2, 10.0)
    assert settings.retry_for("fraud") == RetryConfig(2, 0.1, 9.0)
    assert settings.retry_overrides == (("demo-encoder", "5:0.2:10"), ("fraud", "2"))
    every = settings.replace(retry=PerModel("3"))
    assert every.retry_overrides == (("demo-mlp", "3"), ("demo-encoder", "3"), ("fraud", "3"))
    assert PerModel("2", ((("a", None), "5"),)).describe() == "2,a=5"


@pytest.mark.parametrize(("text", "parts"), [
    ("a=1,b=2", ["a=1", "b=2"]),
    ("m=value:[0.5,0.5],n=fail", ["m=value:[0.5,0.5]", "n=fail"]),
    ("float32[3,224,224]", ["float32[3,224,224]"]),
    ('value:{"a":[1,2],"b":"x,y"},cache', ['value:{"a":[1,2],"b":"x,y"}', "cache"]),
    ("rules:m:f(1,2),x", ["rules:m:f(1,2)", "x"]),
    ("a]b,c", ["a]b", "c"]),
    ("value:[1,2", ["value:[1,2"]),
])
def test_per_model_entries_never_split_inside_brackets_or_quotes(text: str,
                                                                 parts: list[str]) -> None:
    from batchfleet.schemas.per_model import split_top_level
    assert split_top_level(text) == parts


def test_repeated_flags_and_the_variable_keep_bracketed_values_whole() -> None:
    from batchfleet.settings_options import _entries
    assert _entries(["m=value:[0.5,0.5],n@v2=float32[3,4]", "o=1"]) == (
        "m=value:[0.5,0.5]", "n@v2=float32[3,4]", "o=1")
    table = parse_per_model(_entries(["value:[1,2],m=value:[3,4]"]), str, "", "--x")
    assert table.for_model("m") == "value:[3,4]" and table.for_model("z") == "value:[1,2]"
