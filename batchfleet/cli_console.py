"""``batchfleet console``: the operator's web page over the fleet (docs/operations.md,
"Console"). Options come from ``ConsoleSettings``'s declarations."""

from __future__ import annotations

import os
from typing import Any

import typer

from batchfleet.options import fail
from batchfleet.producers.console.settings import ConsoleSettings
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.settings import SettingOption, build, setting_options
from batchfleet.settings_options import command_function, config_lines, parse_given, source_of

OPTIONS: tuple[SettingOption, ...] = tuple(setting_options(ConsoleSettings))
_DOC = """A live web page over the fleet: workers, every model's figures with sparklines,
rollouts, the dead-letter queue and bulk jobs, refreshed every few seconds; and a few
confirmed actions (replay a dead letter, cancel a request, roll back a rollout).

It binds 127.0.0.1 and opens without a key there. Anywhere else it needs --keys-file (the
gateway's keys file): an admin-scoped key signs in once for a session cookie. The gateway
serves the same page at /console/ with `batchfleet gateway --console`.

Examples:

    batchfleet console --broker redis://localhost:6379/0

    batchfleet console --broker kafka://kafka:9092 --results redis://redis:6379/0 --port 9000

    batchfleet console --broker redis://redis:6379/0 --host 0.0.0.0 --keys-file keys.txt
"""


def resolve(values: dict[str, Any]) -> ConsoleSettings:
    from batchfleet.connectors.urls import BrokerURL, results_url_for

    parsed = parse_given(OPTIONS, values)
    if not parsed.get("broker"):
        raise ConfigError("--broker (or BATCHFLEET_BROKER) is required")
    results_url_for(BrokerURL.parse(parsed["broker"]), parsed.get("results"))
    settings: ConsoleSettings = build(ConsoleSettings, parsed)
    return settings.validated()


def _console(ctx: typer.Context, values: dict[str, Any]) -> None:
    try:
        settings = resolve(values)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if values.get("print_config"):
        for line in config_lines(OPTIONS, lambda o: o.get(settings), source_of(ctx)):
            typer.echo(line)
        raise typer.Exit(0)
    import uvicorn

    from batchfleet.cli_gateway import _access_log_to_stderr, _check_port
    from batchfleet.producers.console.app import create_console_app
    from batchfleet.producers.console.sessions import KeySource

    keys = None
    if not settings.open_without_key:
        try:
            keys = KeySource(settings.keys_file, os.environ.get("BATCHFLEET_GATEWAY_KEYS", ""))
            keys.ring()
        except (ConfigError, OSError) as exc:
            raise fail(f"cannot read the keys: {exc}") from exc
    _check_port(settings.host, settings.port)
    _access_log_to_stderr()
    uvicorn.run(create_console_app(settings, keys), host=settings.host, port=settings.port,
                log_level=settings.log_level, proxy_headers=False, server_header=False)


console_command = command_function(OPTIONS, _console, "console", _DOC)
