"""``batchfleet gateway`` (serve the HTTP API), ``gateway hash-key`` and ``gateway openapi``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from batchfleet.options import (
    CallbackAllowNetsOpt,
    CallbackHostsOpt,
    CallbackSchemesOpt,
    NamespaceOpt,
    ResultsOpt,
    fail,
)
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.settings import DEFAULT_CALLBACK_SCHEMES, DEFAULT_NAMESPACE

gateway_app = typer.Typer(invoke_without_command=True, rich_markup_mode="markdown")

KeysFileOpt = Annotated[Path | None, typer.Option(
    "--keys-file", envvar="BATCHFLEET_GATEWAY_KEYS_FILE",
    help="File of API keys, one KEY_ID:SHA256HEX:MODEL1,MODEL2[:OPTIONS] per line (* = any "
         "model; OPTIONS: scopes=admin rate=R burst=B in_flight=N).")]
IdSecretOpt = Annotated[str | None, typer.Option(
    "--id-secret", envvar="BATCHFLEET_GATEWAY_ID_SECRET",
    help="HMAC key for request IDs derived from Idempotency-Key; the same on every replica. "
         "Unset: random per process (idempotency does not survive restarts).")]
PoolOpt = Annotated[int, typer.Option(
    "--redis-max-connections", envvar="BATCHFLEET_GATEWAY_REDIS_MAX_CONNECTIONS",
    help="Size of each Redis connection pool; past it, requests wait for a free connection.")]


def _keys(keys_file: Path | None) -> str:
    text = os.environ.get("BATCHFLEET_GATEWAY_KEYS", "")
    if keys_file is not None:
        text += "\n" + keys_file.read_text()
    return text


@gateway_app.callback()
def gateway(
    ctx: typer.Context,
    broker: Annotated[str | None, typer.Option(
        "--broker", envvar="BATCHFLEET_BROKER",
        help="redis://host:port/db or kafka://host:port[,host:port].")] = None,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    host: Annotated[str, typer.Option(
        envvar="BATCHFLEET_GATEWAY_HOST",
        help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        envvar="BATCHFLEET_GATEWAY_PORT", min=1, max=65535, help="Port to listen on.")] = 8080,
    keys_file: KeysFileOpt = None,
    max_body_bytes: Annotated[int, typer.Option(
        envvar="BATCHFLEET_GATEWAY_MAX_BODY_BYTES", help="Larger bodies get 413.")] = 1 << 20,
    max_batch_items: Annotated[int, typer.Option(
        envvar="BATCHFLEET_GATEWAY_MAX_BATCH_ITEMS", help="Most requests per batch.")] = 1000,
    max_wait_s: Annotated[float, typer.Option(
        envvar="BATCHFLEET_GATEWAY_MAX_WAIT_S", help="Longest long-poll.")] = 60.0,
    callback_schemes: CallbackSchemesOpt = DEFAULT_CALLBACK_SCHEMES,
    callback_hosts: CallbackHostsOpt = "",
    callback_allow_nets: CallbackAllowNetsOpt = "",
    id_secret: IdSecretOpt = None,
    redis_max_connections: PoolOpt = 256,
    admit_max_memory: Annotated[float, typer.Option(
        envvar="BATCHFLEET_ADMIT_MAX_MEMORY",
        help="Answer 503 past this fraction of Redis maxmemory (0: never).")] = 0.8,
    admit_max_backlog: Annotated[int, typer.Option(
        envvar="BATCHFLEET_ADMIT_MAX_BACKLOG",
        help="Answer 503 while a lane holds this many requests (0: no limit).")] = 0,
    log_level: Annotated[str, typer.Option(
        envvar="BATCHFLEET_LOG_LEVEL",
        help="critical, error, warning, info, debug or trace (uvicorn's levels).")] = "info",
) -> None:
    """The HTTP gateway: submit, poll and long-poll over HTTP (docs/http-api.md).

    Without a subcommand it serves the API (FastAPI + uvicorn).

    API keys come from --keys-file and/or BATCHFLEET_GATEWAY_KEYS (entries separated by
    newlines or ';'). Make one with `batchfleet gateway hash-key`.

    Examples:

        batchfleet gateway --broker redis://localhost:6379/0 --keys-file keys.txt --port 8080

        BATCHFLEET_GATEWAY_KEYS='ci:<sha256>:demo-mlp' batchfleet gateway --broker redis://localhost:6379/0
    """
    if ctx.invoked_subcommand is not None:
        return
    if not broker:
        raise fail("--broker (or BATCHFLEET_BROKER) is required")
    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.connectors.urls import BrokerURL, results_url_for
    from batchfleet.producers.gateway import GatewaySettings, KeyRing
    from batchfleet.producers.gateway.server import serve

    try:
        results_url_for(BrokerURL.parse(broker), results)  # a bad URL: one line, exit 2
        settings = GatewaySettings(
            broker=broker, results=results, namespace=namespace,
            keys=KeyRing.parse(_keys(keys_file)),
            callback_policy=CallbackPolicy.parse(callback_schemes, callback_hosts,
                                                 callback_allow_nets),
            max_body_bytes=max_body_bytes, max_batch_items=max_batch_items,
            max_wait_s=max_wait_s, id_secret=id_secret or None,
            redis_max_connections=redis_max_connections, admit_max_memory=admit_max_memory,
            admit_max_backlog=admit_max_backlog).validated()
    except (ConfigError, OSError) as exc:
        raise fail(str(exc)) from exc
    _check_port(host, port)
    _access_log_to_stderr()
    serve(settings, host, port, log_level)


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
