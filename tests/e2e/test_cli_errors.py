"""Every command, run with Redis down, says so in one line and exits with the documented code.

The commands are enumerated from the typer app, so a new command is covered the day it
lands: its required arguments get placeholder values, its broker and result store point
at a loopback port nobody listens on. ``--debug`` brings the traceback back.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from batchfleet.cli import app

pytestmark = pytest.mark.e2e

#: Commands that never reach Redis, or that serve on while it is down, with the reason.
NOT_CLIENTS = {
    "gateway": "a server: it starts with Redis down and answers 503 per request",
    "console": "a server: it starts with Redis down and answers 503 per read "
               "(store_unavailable)",
    "gateway hash-key": "makes a key locally",
    "gateway openapi": "prints the schema from code",
    "models check": "loads a model locally, no broker (tests/unit/test_models_check.py)",
}
#: Arguments for commands whose placeholders would be refused before Redis is tried.
ARGS: dict[str, tuple[str, ...]] = {
    "submit": ("-m", "demo-mlp", "--inputs", "[1.0]"),
    "worker": ("-m", "demo-mlp"),
    "demo": ("-n", "1", "--json"),
    "bench": ("--quick", "-m", "demo-mlp", "-t", "redis", "--no-sweep", "--redis", "{dead}",
              "--out", "{tmp}"),
    "status": ("--once",),
    "dlq replay": ("--all",),
    "dlq purge": ("--all", "--yes"),
    "bulk run": ("-m", "demo-mlp", "-i", "{tmp}/rows.jsonl", "--out", "{tmp}/out.jsonl",
                 "--progress", "none"),
    "webhooks worker": ("--secret", "s3cret", "--burst"),
    "webhooks replay": ("--all",),
    "models declare": ("fraud", "--input", "float32[10]"),
    "pipelines declare": ("embed", "--steps", "demo-tokenize,demo-encoder"),
}
#: The documented exit codes (README "Exit codes"): 1 failed, Redis included, for every
#: command (demo's worker failing to start on a store that is down, too).
EXIT: dict[str, int] = {}


def _commands() -> Iterator[tuple[str, Any]]:
    def walk(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
        if path:
            yield " ".join(path), cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    yield from walk(typer.main.get_command(app), ())


COMMANDS = [name for name, cmd in _commands() if not getattr(cmd, "commands", None)
            or getattr(cmd, "invoke_without_command", False)]


def _placeholders(cmd: Any) -> list[str]:
    """Values for a command's required arguments (broker and results come from the env)."""
    args: list[str] = []
    for param in cmd.params:
        if not param.required or param.name in ("broker", "results"):
            continue
        value = "demo-mlp" if param.name == "model" else "x"
        args += [value] if param.param_type_name == "argument" else [param.opts[0], value]
    return args


def _dead_url() -> str:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def _run(args: list[str], tmp: Path, *, debug: bool = False) -> subprocess.CompletedProcess[str]:
    dead = _dead_url()
    (tmp / "rows.jsonl").write_text('{"inputs": [1.0]}\n')
    env = os.environ | {"BATCHFLEET_BROKER": dead, "BATCHFLEET_RESULTS": dead,
                        "COLUMNS": "200"}
    env.pop("BATCHFLEET_DEBUG", None)
    args = [a.format(dead=dead, tmp=tmp) for a in args]
    return subprocess.run([sys.executable, "-m", "batchfleet", *(["--debug"] if debug else []),
                           *args], capture_output=True, text=True, env=env, timeout=90,
                          check=False)


def _args(name: str) -> list[str]:
    cmd = dict(_commands())[name]
    return [*name.split(), *(ARGS[name] if name in ARGS else _placeholders(cmd))]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_with_redis_down_is_one_line(name: str, tmp_path: Path) -> None:
    if name in NOT_CLIENTS:
        pytest.skip(NOT_CLIENTS[name])
    done = _run(_args(name), tmp_path)
    shown = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == EXIT.get(name, 1), shown
    assert "Traceback" not in done.stderr and "╭" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout  # logs and the error on stderr: pipes stay clean
    assert len(shown) <= 3, shown
    assert shown[-1].startswith("error: "), shown


def test_every_command_is_in_the_table_or_takes_placeholders() -> None:
    """A new command either works with placeholder arguments or gets a row in ARGS."""
    assert {"dlq list", "bulk status", "webhooks failed", "models list"} <= set(COMMANDS)
    assert not (set(ARGS) | set(NOT_CLIENTS)) - set(COMMANDS), "stale rows"


@pytest.mark.parametrize("name", ["dlq list", "webhooks failed", "status", "submit", "worker"])
def test_debug_shows_the_traceback(name: str, tmp_path: Path) -> None:
    """status, submit and worker turn their errors into the line themselves: --debug
    shows what they caught as well."""
    done = _run(_args(name), tmp_path, debug=True)
    assert done.returncode != 0
    assert "Traceback" in done.stderr or "╭" in done.stderr, done.stderr
    assert any(why in done.stderr for why in ("Error 111", "onnect", "not answering"))


def test_submit_with_kafka_down_prints_only_our_line(tmp_path: Path, redis_url: str) -> None:
    """aiokafka logs its raw connect failure first unless the CLI silences its logger."""
    pytest.importorskip("aiokafka")
    dead = _dead_url().replace("redis://", "kafka://").removesuffix("/0")
    declared = _run(["models", "declare", "demo-mlp", "--broker", redis_url,
                     "--results", redis_url], tmp_path)
    assert declared.returncode == 0, declared.stderr
    done = _run(["submit", "-m", "demo-mlp", "--inputs", "[1.0]", "--broker", dead,
                 "--results", redis_url], tmp_path)
    shown = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and len(shown) == 1 and shown[0].startswith("error: "), shown


def test_a_failed_webhook_delivery_is_one_log_line(tmp_path: Path, redis_url: str) -> None:
    """RQ logs a job's whole traceback per attempt; a delivery's own error is one line."""
    pytest.importorskip("rq")
    import redis
    from rq import Queue

    from batchfleet.connectors.webhook_jobs import JOB_FUNC
    from batchfleet.schemas.names import Names

    conn = redis.Redis.from_url(redis_url)
    try:  # no result record for this request: the job gives up at once, no retries
        Queue(Names("bf").webhook_queue, connection=conn).enqueue(
            JOB_FUNC, "bf", "gone-request", 0, "https://example.com/hook")
    finally:
        conn.close()
    done = _run(["webhooks", "worker", "--secret", "s3cret", "--burst",
                 "--results", redis_url], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [x for x in done.stderr.splitlines() if "gone-request" in x]
    assert "failed: _GiveUp: result of gone-request is gone" in line
