"""Every option written once: the connection options of every command come from their one
declaration (``schemas/settings.py``), the gateway's options are generated from its
settings fields like the worker's, and nothing below the CLI reads the environment."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.cli_gateway import OPTIONS as GATEWAY_OPTIONS
from batchfleet.producers.gateway.settings import GatewaySettings, ServeSettings
from batchfleet.schemas.settings import (
    APP_DIR,
    BROKER,
    CALLBACK_ALLOW_NETS,
    CALLBACK_HOSTS,
    CALLBACK_SCHEMES,
    NAMESPACE,
    RESULTS,
    WEBHOOK_RESULTS,
    format_value,
    setting_options,
    truth,
    type_parser,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LINKED = {"schemas", "connectors", "producers", "workers"}
#: Module -> why it may read the environment although it is not the CLI. Keep it short.
READS_ENV = {
    # OpenTelemetry's contract is the OTEL_* variables, read by whatever process embeds the
    # SDK Client (no batchfleet CLI runs there), decided once per process.
    "connectors/tracing.py": "OTEL_* for SDK embedders (the OpenTelemetry spec)",
    # The delivery job is its own entry point under a plain `rq worker` (docs/webhooks.md);
    # it reads the same declarations `batchfleet webhooks worker` generates its options from.
    "connectors/webhook_jobs.py": "the RQ job's entry point under a plain `rq worker`",
    # Copies the environment into the worker subprocesses it starts; reads no setting.
    "batchfleet/processes.py": "passes the environment on to child processes",
    "batchfleet/bench/naive_rq.py": "passes the environment on to the RQ baseline's workers",
    # A bench row says it was skipped when OTEL_* would turn tracing on in its own process.
    "batchfleet/bench/tracing_cost.py": "asks whether OTEL_* turns tracing on here",
}
#: The connection declarations, by flag; every command's option must be one of these.
DECLARED = {"--broker": (BROKER,), "--results": (RESULTS, WEBHOOK_RESULTS),
            "--namespace": (NAMESPACE,), "--callback-schemes": (CALLBACK_SCHEMES,),
            "--callback-hosts": (CALLBACK_HOSTS,),
            "--callback-allow-nets": (CALLBACK_ALLOW_NETS,), "--app-dir": (APP_DIR,)}


def _below_the_cli() -> list[Path]:
    found = [p for linked in LINKED for p in (ROOT / linked).rglob("*.py")]
    for path in (ROOT / "batchfleet").rglob("*.py"):
        parts = path.relative_to(ROOT / "batchfleet").parts
        if parts[0] not in LINKED and not parts[0].startswith("cli"):
            found.append(path)
    return sorted(found)


def _env_reads(path: Path) -> list[int]:
    """Lines reading ``os.environ`` / ``os.getenv`` (or importing ``environ``/``getenv``)."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if _reads_env(node)]


def _reads_env(node: ast.AST) -> bool:
    names = ("environ", "getenv", "environb")
    if isinstance(node, ast.Attribute):
        return node.attr in names and isinstance(node.value, ast.Name) and node.value.id == "os"
    if isinstance(node, ast.ImportFrom):
        return node.module == "os" and any(a.name in names for a in node.names)
    return False


def test_nothing_below_the_cli_reads_the_environment() -> None:
    modules = _below_the_cli()
    assert len(modules) > 100  # the walk found the packages
    offenders = {rel: lines for p in modules
                 if (lines := _env_reads(p)) and (rel := str(p.relative_to(ROOT))) not in READS_ENV}
    assert offenders == {}


def test_the_env_allow_list_is_not_stale(tmp_path: Path) -> None:
    for rel in READS_ENV:
        assert _env_reads(ROOT / rel), f"{rel} no longer reads the environment: drop it"
    cases = {"import os\nx = os.environ['A']": 1, "import os\nos.getenv('A')": 1,
             "from os import environ": 1, "from os import getpid": 0, "x = environ": 0}
    for source, expected in cases.items():
        path = tmp_path / "m.py"
        path.write_text(source + "\n")
        assert len(_env_reads(path)) == expected, source


def _commands(command: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every command and group under ``command``, the lazily loaded (worker) ones too
    (typer's own click: duck-typed)."""
    found = [(path, command)]
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                found += _commands(sub, f"{path} {name}".strip())
    return found


def _envvars(param: Any) -> tuple[str, ...]:
    envvar: Any = getattr(param, "envvar", None)
    return (envvar,) if isinstance(envvar, str) else tuple(envvar or ())


def test_every_commands_connection_options_come_from_the_one_declaration() -> None:
    seen: dict[str, int] = {}
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            flag = next((o for o in param.opts if o in DECLARED), None)
            if flag is None:
                continue
            seen[flag] = seen.get(flag, 0) + 1
            helps = [d.help for d in DECLARED[flag]]
            envs = [(d.env, *d.also_env) for d in DECLARED[flag]]
            assert _envvars(param) in envs, (path, flag)
            shown = getattr(param, "help", "") or ""
            # demo's --broker adds what `kafka` and no broker mean to the declared text
            assert any(shown.startswith(h) for h in helps), (path, flag, shown)
    assert seen["--broker"] >= 25 and seen["--namespace"] >= 25 and seen["--results"] >= 25
    assert all(seen.get(flag) for flag in DECLARED)


def test_one_boolean_parser() -> None:
    import batchfleet.workers.settings as worker_settings

    assert type_parser(bool) is truth
    assert not hasattr(worker_settings, "_truth") and not hasattr(worker_settings, "_bool")
    assert [truth(v) for v in ("on", "YES", "1", "false", "off", "0")] == [True] * 3 + [False] * 3
    with pytest.raises(ValueError, match="true or false"):
        truth("maybe")


# --- the gateway's generated options ----------------------------------------------------

#: The gateway's variables before its options were generated: they must not change.
GATEWAY_ENV = {
    "broker": "BATCHFLEET_BROKER", "results": "BATCHFLEET_RESULTS",
    "namespace": "BATCHFLEET_NAMESPACE", "host": "BATCHFLEET_GATEWAY_HOST",
    "port": "BATCHFLEET_GATEWAY_PORT", "keys_file": "BATCHFLEET_GATEWAY_KEYS_FILE",
    "max_body_bytes": "BATCHFLEET_GATEWAY_MAX_BODY_BYTES",
    "max_batch_items": "BATCHFLEET_GATEWAY_MAX_BATCH_ITEMS",
    "max_wait_s": "BATCHFLEET_GATEWAY_MAX_WAIT_S",
    "callback_schemes": "BATCHFLEET_CALLBACK_SCHEMES",
    "callback_hosts": "BATCHFLEET_CALLBACK_HOSTS",
    "callback_allow_nets": "BATCHFLEET_CALLBACK_ALLOW_NETS",
    "id_secret": "BATCHFLEET_GATEWAY_ID_SECRET",
    "redis_max_connections": "BATCHFLEET_GATEWAY_REDIS_MAX_CONNECTIONS",
    "admit_max_memory": "BATCHFLEET_ADMIT_MAX_MEMORY",
    "admit_max_backlog": "BATCHFLEET_ADMIT_MAX_BACKLOG",
    "console": "BATCHFLEET_GATEWAY_CONSOLE",  # issue 30
    "log_level": "BATCHFLEET_LOG_LEVEL",
}
#: Their defaults before, as --help showed them.
GATEWAY_DEFAULTS = {"namespace": "bf", "host": "127.0.0.1", "port": "8080",
                    "max_body_bytes": "1048576", "max_batch_items": "1000", "max_wait_s": "60.0",
                    "callback_schemes": "https", "callback_hosts": "",
                    "callback_allow_nets": "", "redis_max_connections": "256",
                    "admit_max_memory": "0.8", "admit_max_backlog": "0", "log_level": "info"}


def test_gateway_options_are_generated_with_their_old_names_and_defaults() -> None:
    command = typer.main.get_command(app).commands["gateway"]  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}
    options = {o.name: o for o in GATEWAY_OPTIONS}
    assert {n: o.env for n, o in options.items()} == GATEWAY_ENV
    assert {n for n, o in options.items() if n in params} == set(GATEWAY_ENV)
    for name, option in options.items():
        assert option.flag == "--" + name.replace("_", "-")
        assert params[name].envvar == option.env and params[name].default is None, name
    for name, shown in GATEWAY_DEFAULTS.items():
        assert format_value(options[name].default) == shown, name
    assert {o.name for o in setting_options(ServeSettings)} <= set(options)
    assert GatewaySettings(broker="redis://h:1/0").max_body_bytes == 1 << 20


def _gateway_config(*args: str, env: dict[str, str] | None = None) -> list[str]:
    clean: dict[str, str | None] = {e: None for e in GATEWAY_ENV.values()}
    clean["BATCHFLEET_GATEWAY_KEYS"] = None
    done = CliRunner().invoke(app, ["gateway", *args, "--print-config"], env=clean | (env or {}))
    assert done.exit_code == 0, done.output
    return done.stdout.splitlines()


def test_gateway_print_config_says_where_each_value_came_from() -> None:
    lines = _gateway_config("--broker", "redis://:hunter2@h:1/0", "--port", "9000",
                            env={"BATCHFLEET_GATEWAY_MAX_WAIT_S": "5",
                                 "BATCHFLEET_GATEWAY_PORT": "7000",
                                 "BATCHFLEET_GATEWAY_ID_SECRET": "s" * 20,
                                 "BATCHFLEET_GATEWAY_KEYS": "ci:" + "0" * 64 + ":*"})
    assert "broker = redis://:***@h:1/0  # flag --broker" in lines
    assert "port = 9000  # flag --port" in lines  # the flag beats the variable
    assert "max_wait_s = 5.0  # env BATCHFLEET_GATEWAY_MAX_WAIT_S" in lines
    assert "max_body_bytes = 1048576  # default" in lines
    assert "results = the broker's URL  # default" in lines
    assert "id_secret = ***  # env BATCHFLEET_GATEWAY_ID_SECRET" in lines
    assert "keys = 1 configured" in lines
    assert not any("hunter2" in line or "ssss" in line for line in lines)
    names = [line.split(" = ", 1)[0] for line in lines[:-1]]
    assert names == [o.name for o in GATEWAY_OPTIONS]


def test_gateway_refuses_a_bad_value_in_one_line_naming_the_flag() -> None:
    for args, message in ((["--port", "0"], "--port '0'"),
                          (["--max-body-bytes", "lots"], "--max-body-bytes 'lots'"),
                          ([], "--broker (or BATCHFLEET_BROKER) is required")):
        broker = ["--broker", "redis://h:1/0"] if args else []
        done = CliRunner().invoke(app, ["gateway", *broker, *args, "--print-config"],
                                  env={"BATCHFLEET_BROKER": None})
        assert done.exit_code == 2, done.output
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_webhook_delivery_settings_are_declared_once() -> None:
    """``webhooks worker`` and a plain ``rq worker`` (``DeliveryConfig.from_env``) read the
    same declared variables."""
    from batchfleet.connectors.webhook_jobs import DeliveryConfig
    from batchfleet.schemas.errors import ConfigError
    from batchfleet.schemas.settings import WEBHOOK_SECRET, WEBHOOK_TIMEOUT_S

    webhooks = typer.main.get_command(app).commands["webhooks"]  # type: ignore[attr-defined]
    params = {p.name: p for p in webhooks.commands["worker"].params}
    for name, declaration in (("secret", WEBHOOK_SECRET), ("timeout_s", WEBHOOK_TIMEOUT_S)):
        assert declaration.flag in params[name].opts
        assert params[name].envvar == declaration.env and params[name].help == declaration.help
    assert params["timeout_s"].default == DeliveryConfig("s").timeout_s == 10.0

    config = DeliveryConfig.from_env({WEBHOOK_SECRET.env: "whsec", WEBHOOK_TIMEOUT_S.env: "3",
                                      CALLBACK_HOSTS.env: "hooks.example.com"})
    assert (config.secret, config.timeout_s) == ("whsec", 3.0)
    assert config.policy.hosts == ("hooks.example.com",)
    with pytest.raises(ConfigError, match=WEBHOOK_SECRET.env):
        DeliveryConfig.from_env({})


# --- bulk run's generated options --------------------------------------------------------

#: ``bulk run``'s declared options before they were generated: flag's name -> (variable or
#: None, default as --help showed it). They must not change.
BULK_RUN = {
    "errors": (None, "none"), "shard": (None, "none"), "s3_endpoint": (None, "none"),
    "staging_dir": ("BATCHFLEET_BULK_STAGING_DIR", "none"),
    "job_id": ("BATCHFLEET_BULK_JOB_ID", "none"), "retry_failed": (None, "false"),
    "restart": (None, "false"), "max_failure_rate": (None, "0.0"),
    "window": ("BATCHFLEET_BULK_WINDOW", "4096"), "dtype": (None, "auto"),
    "input_column": (None, "none"), "feature_columns": (None, "none"),
    "id_column": (None, "custom_id"), "max_line_bytes": (None, str(16 * 1024 * 1024)),
    "version": (None, "none"), "degrade": (None, "allow"), "early_stop_rows": (None, "100"),
    "early_stop_rate": (None, "0.5"), "progress": (None, "auto"), "stall_s": (None, "600.0"),
    "part_rows": (None, "65536"),
}
#: Hand-written in the command: required values, the deprecated alias, connection, logging.
BULK_HANDWRITTEN = {"model", "input", "broker", "out", "results", "old_output", "namespace",
                    "log_format", "log_level", "as_json", "print_config"}


def _bulk_run() -> Any:
    bulk = typer.main.get_command(app).commands["bulk"]  # type: ignore[attr-defined]
    return bulk.commands["run"]


def test_bulk_run_options_are_generated_with_their_old_names_and_defaults() -> None:
    from batchfleet.cli_bulk import RUN_OPTIONS

    params = {p.name: p for p in _bulk_run().params}
    options = {o.name: o for o in RUN_OPTIONS}
    assert set(options) == set(BULK_RUN)
    assert set(params) == set(BULK_RUN) | BULK_HANDWRITTEN
    for name, (env, shown) in BULK_RUN.items():
        option, param = options[name], params[name]
        flag = "--" + name.replace("_", "-")
        assert option.flag == flag and flag in param.opts, name
        assert param.envvar == env and param.default is None, name
        assert option.envs == (() if env is None else (env,)), name
        assert option.show_default() == shown, name
    assert params["retry_failed"].secondary_opts == ["--no-retry-failed"]
    assert set(params["old_output"].opts) == {"--output", "-o"} and params["old_output"].hidden


def _bulk_config(*args: str, env: dict[str, str] | None = None) -> Any:
    clean: dict[str, str | None] = {e: None for e, _ in BULK_RUN.values() if e}
    return CliRunner().invoke(app, ["bulk", "run", "-m", "m", "-i", "in.jsonl", "--broker",
                                    "redis://h:1/0", *args, "--print-config"],
                              env=clean | (env or {}))


def test_bulk_run_print_config_and_bad_values() -> None:
    done = _bulk_config("--window", "8", "--retry-failed",
                        env={"BATCHFLEET_BULK_JOB_ID": "nightly", "BATCHFLEET_BULK_WINDOW": "9"})
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert "window = 8  # flag --window" in lines  # the flag beats the variable
    assert "job_id = nightly  # env BATCHFLEET_BULK_JOB_ID" in lines
    assert "retry_failed = true  # flag --retry-failed" in lines
    assert "stall_s = 600.0  # default" in lines
    assert [line.split(" = ", 1)[0] for line in lines] == list(BULK_RUN)
    bad = _bulk_config("--window", "lots")
    assert bad.exit_code == 2 and "--window 'lots'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# --- the SDK client's keywords ---------------------------------------------------------


def test_client_keywords_are_the_declared_client_settings() -> None:
    """``AsyncClient``'s keywords are exactly ``ClientSettings``'s fields, with its
    defaults, so the declaration documents every keyword and nothing else."""
    import inspect
    from dataclasses import fields

    from batchfleet.producers import AsyncClient
    from batchfleet.producers.client_settings import CLIENT_DEFAULTS, ClientSettings

    keywords = {name: p.default for name, p in
                inspect.signature(AsyncClient.__init__).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == {f.name: getattr(CLIENT_DEFAULTS, f.name) for f in fields(ClientSettings)}
    #: The defaults before they were declared: they must not change.
    assert (CLIENT_DEFAULTS.namespace, CLIENT_DEFAULTS.kafka_partitions,
            CLIENT_DEFAULTS.poll_interval_s, CLIENT_DEFAULTS.check_model,
            CLIENT_DEFAULTS.redis_max_connections, CLIENT_DEFAULTS.model_list_ttl_s) == (
                "bf", 4, 1.0, True, None, 5.0)
    options = {o.name: o for o in setting_options(ClientSettings)}
    assert options["namespace"].opt == NAMESPACE  # the one shared declaration
    assert "callback_policy" not in options and "admission" not in options  # objects


def test_request_commands_namespace_is_the_clients_declaration() -> None:
    from batchfleet.producers.client_settings import ClientSettings

    namespace = {o.name: o for o in setting_options(ClientSettings)}["namespace"]
    commands = dict(_commands(typer.main.get_command(app)))
    for name in ("submit", "result", "cancel"):
        params = {p.name: p for p in commands[name].params}
        assert params["namespace"].envvar == namespace.env, name
        assert params["namespace"].default == namespace.default, name
