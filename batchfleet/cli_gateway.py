"""``batchfleet gateway`` (serve the HTTP API), ``gateway hash-key`` and ``gateway openapi``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from batchfleet.options import fail
from batchfleet.producers.gateway.settings import GatewaySettings, ServeSettings
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.settings import SettingOption, build, setting_options
from batchfleet.settings_options import command_function, config_lines, parse_given, source_of

gateway_app = typer.Typer(rich_markup_mode="markdown")

#: Every option of the gateway command, in --help order, from the settings declarations.
OPTIONS: tuple[SettingOption, ...] = (*setting_options(GatewaySettings),
                                      *setting_options(ServeSettings))
_SERVE = frozenset(o.name for o in setting_options(ServeSettings))
_DOC = """The HTTP gateway: submit, poll and long-poll over HTTP (docs/http-api.md).

Without a subcommand it serves the API (FastAPI + uvicorn).

API keys come from --keys-file and/or BATCHFLEET_GATEWAY_KEYS (entries separated by
newlines or ';'). Make one with `batchfleet gateway hash-key`.

Examples:

    batchfleet gateway --broker redis://localhost:6379/0 --keys-file keys.txt --port 8080

    BATCHFLEET_GATEWAY_KEYS='ci:<sha256>:demo-mlp' batchfleet gateway --broker redis://localhost:6379/0
"""


def _keys(keys_file: str | None) -> str:
    text = os.environ.get("BATCHFLEET_GATEWAY_KEYS", "")
    if keys_file is not None:
        text += "\n" + Path(keys_file).read_text()
    return text


def resolve(values: dict[str, Any], *, need_keys: bool = True
            ) -> tuple[GatewaySettings, ServeSettings]:
    """Settings from the options that were given (None: not given). Raises ConfigError
    (a bad value, a missing broker) or OSError (an unreadable keys file)."""
    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.connectors.urls import BrokerURL, results_url_for
    from batchfleet.producers.gateway import KeyRing

    parsed = parse_given(OPTIONS, values)
    if not parsed.get("broker"):
        raise ConfigError("--broker (or BATCHFLEET_BROKER) is required")
    results_url_for(BrokerURL.parse(parsed["broker"]), parsed.get("results"))  # one line, exit 2
    serve = build(ServeSettings, {k: v for k, v in parsed.items() if k in _SERVE})
    settings = build(
        GatewaySettings, {k: v for k, v in parsed.items() if k not in _SERVE},
        keys=KeyRing.parse(_keys(serve.keys_file)),
        callback_policy=CallbackPolicy.parse(serve.callback_schemes, serve.callback_hosts,
                                             serve.callback_allow_nets))
    return settings.validated(need_keys=need_keys), serve


def _gateway(ctx: typer.Context, values: dict[str, Any]) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from batchfleet.producers.gateway.server import serve

    printing = bool(values.get("print_config"))
    try:
        settings, where = resolve(values, need_keys=not printing)
    except (ConfigError, OSError) as exc:
        raise fail(str(exc)) from exc
    if printing:
        def value_of(option: SettingOption) -> Any:
            value = option.get(where if option.name in _SERVE else settings)
            return "" if value is None and option.opt.show else value  # "" shows opt.show

        for line in config_lines(OPTIONS, value_of, source_of(ctx)):
            typer.echo(line)
        typer.echo(f"keys = {len(settings.keys.keys)} configured")
        raise typer.Exit(0)
    _check_port(where.host, where.port)
    _access_log_to_stderr()
    serve(settings, where.host, where.port, where.log_level)


gateway_app.callback(invoke_without_command=True)(
    command_function(OPTIONS, _gateway, "gateway", _DOC))


def _access_log_to_stderr() -> None:
    """uvicorn's default logging sends its access lines to stdout; every log line of
    ours goes to stderr (README "Commands"), so the entry point points them there."""
    from uvicorn.config import LOGGING_CONFIG

    LOGGING_CONFIG["handlers"]["access"]["stream"] = "ext://sys.stderr"


def _check_port(host: str, port: int) -> None:
    """A port already taken is one line and exit 1 before uvicorn starts (it would log
    its start-up, then the bind error, and exit 3). A race with another binder is left
    to uvicorn."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}: another "
                       "process holds it; pick another --port", 1) from exc


@gateway_app.command("hash-key")
def hash_key_cmd(
    key_id: Annotated[str, typer.Option("--id", help="Name of the key (who uses it).")] = "default",
    models: Annotated[str, typer.Option(
        "--models", help="Models it may use, comma-separated; * for all.")] = "*",
    stdin: Annotated[bool, typer.Option(
        "--stdin", help="Hash a key read from stdin instead of making a new one.")] = False,
    scopes: Annotated[str, typer.Option(
        "--scopes", help="Extra powers, comma-separated: admin (read every key's results).")] = "",
    rate: Annotated[float, typer.Option("--rate", help="Requests per second; 0: no limit.")] = 0,
    burst: Annotated[int, typer.Option(
        "--burst", help="Requests at once after a quiet spell; 0: one second's worth "
                        "(--rate).")] = 0,
    max_in_flight: Annotated[int, typer.Option(
        "--max-in-flight", help="Requests submitted and not yet finished; 0: no limit.")] = 0,
) -> None:
    """Make an API key and print it with the line to add to the gateway's keys.

    The key itself is printed once, to stderr; only its hash goes into the keys file.

    Examples:

        batchfleet gateway hash-key --id billing --models demo-mlp >> keys.txt

        echo -n "$EXISTING_KEY" | batchfleet gateway hash-key --id ci --stdin

        batchfleet gateway hash-key --id tenant-a --rate 50 --burst 100 --max-in-flight 500

        batchfleet gateway hash-key --id ops --scopes admin
    """
    from batchfleet.connectors.quotas import Quota
    from batchfleet.producers.gateway import ApiKey, KeyRing, hash_key, new_key

    key = sys.stdin.read().strip() if stdin else new_key()
    line = ApiKey(key_id, hash_key(key), frozenset(m.strip() for m in models.split(",")),
                  frozenset(s.strip() for s in scopes.split(",") if s.strip()),
                  Quota(rate, burst, max_in_flight)).line()
    try:
        KeyRing.parse(line)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if not stdin:
        typer.echo(f"API key (keep it secret, shown once): {key}", err=True)
    typer.echo(line)


@gateway_app.command("openapi")
def openapi_cmd() -> None:
    """Print the gateway's OpenAPI spec (JSON); the server also serves it at /openapi.json.

    Examples:

        batchfleet gateway openapi > openapi.json
    """
    from batchfleet.producers.gateway import GatewaySettings, KeyRing, create_app

    placeholder = KeyRing.parse("spec:" + "0" * 64 + ":*")
    app = create_app(GatewaySettings(broker="redis://localhost:6379/0", keys=placeholder))
    typer.echo(json.dumps(app.openapi(), indent=2))
