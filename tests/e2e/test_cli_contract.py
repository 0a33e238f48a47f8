"""The command line's contract (issue 25): exit codes as the README's table says, stdout
only the command's output (valid JSON in JSON mode, empty on an error), logs and the
one error line on stderr, and the items that once broke it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from batchfleet import options
from batchfleet.cli import app
from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.values import DeadLetter
from batchfleet.producers.gateway import hash_key
from batchfleet.schemas.names import Names
from batchfleet.workers.middleware.stuck import EXIT_STUCK
from tests.e2e.test_cli_errors import COMMANDS, _dead_url

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = "[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]"


def _cli(*args: str, env: dict[str, str] | None = None, columns: int = 80
         ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("BATCHFLEET_CALLBACK", "BATCHFLEET_DEBUG"))}
    return subprocess.run([sys.executable, "-m", "batchfleet", *args], capture_output=True,
                          text=True, timeout=90, check=False,
                          env=base | {"COLUMNS": str(columns)} | (env or {}))


def _in_process(*args: str, env: dict[str, str] | None = None) -> Any:
    """The same command in this process: for checks of codes and lines, not of streams."""
    clean: dict[str, str | None] = {"BATCHFLEET_CALLBACK_SCHEMES": None,
                                    "BATCHFLEET_CALLBACK_ALLOW_NETS": None, "COLUMNS": "80"}
    return CliRunner().invoke(app, list(args), env=clean | (env or {}))


def _one_error(done: Any, code: int) -> str:
    """The one ``error:`` line on stderr, stdout empty, the exit code."""
    stdout = getattr(done, "stdout", "")
    assert (getattr(done, "returncode", None) or getattr(done, "exit_code", None)) == code, (
        stdout, done.stderr)
    assert stdout == "", stdout
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return str(line)


def test_the_readme_publishes_the_exit_code_table() -> None:
    """One table, in the README, names every code the commands use."""
    text = README.read_text()
    table = text.split("#### Exit codes", 1)[1].split("\n\n", 2)[2].split("\n\n")[0]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == {0, options.EXIT_FAILED, options.EXIT_USAGE, 3, 4, 130, 143, EXIT_STUCK}


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_flag_is_one_error_line_and_exit_2(name: str) -> None:
    """Not typer's five-line box: the same ``error:`` line as every other refusal."""
    done = CliRunner().invoke(app, [*name.split(), "--no-such-flag"], env={"COLUMNS": "80"})
    line = _one_error(done, 2)
    assert "No such option: --no-such-flag" in line and "--help" in line


def test_an_unknown_command_is_one_error_line_and_exit_2() -> None:
    line = _one_error(_cli("no-such-command"), 2)
    assert "No such command 'no-such-command'" in line


def test_result_wait_with_redis_down_is_one_line_within_its_wait() -> None:
    """Once 7 reconnect warnings on stdout and 11.7 s for --wait 3: --wait bounds it all."""
    started = time.monotonic()
    done = _cli("result", "some-id", "--wait", "0.5", "--json", "--broker", _dead_url())
    took = time.monotonic() - started
    _one_error(done, 1)
    assert took < 60  # liveness only: it ends, it does not wait out the SDK's budget


def test_submit_and_result_in_json_and_every_refusal_is_exit_2(
        redis_url: str, tmp_path: Path) -> None:
    at = ("--broker", redis_url)
    assert _cli("models", "declare", "demo-mlp", "--input-spec", "float32[10]",
                *at).returncode == 0
    sent = _cli("submit", "-m", "demo-mlp", "--inputs", ROW, "-o", "json", *at)
    assert sent.returncode == 0, sent.stderr
    rid = json.loads(sent.stdout)["request_id"]
    pending = _cli("result", rid, "-o", "json", *at)
    assert pending.returncode == 3 and json.loads(pending.stdout)["status"] == "pending"
    assert _cli("result", rid, "-o", "yaml", *at).stdout.startswith("request_id: ")
    (tmp_path / "rows.jsonl").write_text('{"inputs": [1.0]}\n')
    for refused in (["-m", "demo-mlp", "--inputs", '["a"]'], ["-m", "demo-mlp", "--inputs",
                    "[1,2"], ["-m", "demo-mlp", "--inputs", "[1.0]"], ["-m", "nope", "--inputs",
                    ROW], ["-m", "demo-mlp", "--inputs-file", str(tmp_path / "rows.jsonl")]):
        _one_error(_in_process("submit", *refused, *at), 2)


def test_submit_honours_the_gateways_callback_variables(redis_url: str) -> None:
    """The SDK reads no environment (``callback_policy=``); ``submit`` is an entry point
    and reads the same variables as the gateway and the webhooks worker."""
    at = ("--broker", redis_url)
    assert _cli("models", "declare", "demo-mlp", *at).returncode == 0
    hook = ("--callback-url", "http://127.0.0.1:9/hook")
    line = _one_error(_in_process("submit", "-m", "demo-mlp", "--inputs", ROW, *hook, *at), 2)
    assert "callback" in line
    allowed = _in_process("submit", "-m", "demo-mlp", "--inputs", ROW, *hook, *at,
                          env={"BATCHFLEET_CALLBACK_SCHEMES": "http",
                               "BATCHFLEET_CALLBACK_ALLOW_NETS": "127.0.0.0/8"})
    assert allowed.exit_code == 0 and allowed.stdout.strip(), allowed.stderr


def test_times_in_json_are_iso_8601_utc(redis_url: str) -> None:
    at = ("--broker", redis_url)
    snap = json.loads(_in_process("status", "--once", "-o", "json", *at).stdout)
    assert snap["taken_at"].endswith("+00:00")
    assert _in_process("models", "declare", "demo-mlp", *at).exit_code == 0
    [record] = json.loads(_in_process("models", "list", "-o", "json", *at).stdout)
    assert record["declared"]["at"].endswith("+00:00")


def test_the_gateway_on_a_taken_port_is_one_line_and_exit_1(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        keys = f"k:{hash_key('secret-key')}:*"
        done = _cli("gateway", "--broker", redis_url, "--port", str(port),
                    env={"BATCHFLEET_GATEWAY_KEYS": keys})
    line = _one_error(done, 1)
    assert f"127.0.0.1:{port}" in line


def test_running_the_worker_cli_module_writes_nothing() -> None:
    """It once regenerated README.md (in site-packages, when installed): now `make
    readme-table` does, and running the module does nothing."""
    before = README.read_bytes()
    done = subprocess.run([sys.executable, "-m", "batchfleet.cli_worker"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "" and README.read_bytes() == before


def test_old_flag_spellings_still_work_with_a_note(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["bulk", "run", "-m", "demo-mlp", "-i", "in.jsonl", "-o",
                                    "out.jsonl", "--broker", "http://x:1"])
    assert done.exit_code == 2
    note, error = done.stderr.strip().splitlines()
    assert "-o is deprecated" in note and "--out" in note and "unknown scheme" in error


async def test_piped_dlq_rows_are_one_line_each_and_models_are_positional(
        redis_url: str) -> None:
    """The `--help` example `dlq list -o wide --no-headers | awk '{print $1}'` prints the
    whole IDs and nothing else, on an 80-column terminal too."""
    ids = [f"req-{n}-" + "0123456789abcdef" * 5 for n in range(3)]
    client = redis_client(redis_url)
    try:
        await DeadLetterQueue(client, Names("bf")).add([DeadLetter(
            rid, "demo-mlp", b"", 3, [{"type": "validation_error", "retryable": False,
                                      "message": "unsupported\ntypes: str, object " * 4,
                                      "at": 1.7e9}], "retries exhausted") for rid in ids])
    finally:
        await client.aclose()
    at = ("--broker", redis_url)
    wide = _cli("dlq", "list", "-o", "wide", "--no-headers", *at, columns=80)
    assert wide.returncode == 0, wide.stderr
    assert [line.split()[0] for line in wide.stdout.splitlines()] == ids
    assert "━" not in wide.stdout and "dead letters" not in wide.stdout
    positional = _cli("dlq", "list", "demo-mlp", "-o", "json", *at)
    assert [d["request_id"] for d in json.loads(positional.stdout)] == ids
    assert json.loads(positional.stdout)[0]["errors"][0]["at"].endswith("+00:00")
    unknown = _cli("dlq", "list", "-m", "nope", "-o", "json", *at)
    assert unknown.returncode == 0 and json.loads(unknown.stdout) == []
    [warning] = unknown.stderr.strip().splitlines()
    assert warning.startswith("warning: no dead-letter queue for model 'nope'")
    assert "demo-mlp" in warning


def test_a_worker_with_kafka_down_prints_only_our_line(redis_url: str) -> None:
    """aiokafka logged its raw "Unable connect to ..." before the worker's own line."""
    pytest.importorskip("aiokafka")
    dead = _dead_url().replace("redis://", "kafka://").removesuffix("/0")
    done = _cli("worker", "--broker", dead, "--results", redis_url, "-m", "demo-mlp",
                "--device", "cpu")
    line = _one_error(done, 1)
    assert "Kafka" in line and dead.removeprefix("kafka://") in line


def test_submit_wait_past_a_slow_submit_is_pending_with_its_id(redis_url: str) -> None:
    """Review finding 9: writes held up 2.5 s (``CLIENT PAUSE WRITE``) make the submit
    return late, so --wait 4 (plus 1 s closing) runs out inside ``client.wait``. The request
    is queued: exit 3 with its ID, as the exit-code table says, not "no answer" and exit 1."""
    at = ("--broker", redis_url)
    assert _in_process("models", "declare", "demo-mlp", *at).exit_code == 0
    raw = redis.Redis.from_url(redis_url)
    raw.execute_command("CLIENT", "PAUSE", "2500", "WRITE")
    done = _in_process("submit", "-m", "demo-mlp", "--inputs", ROW, "--wait", "4",
                       "-o", "json", *at)
    assert done.exit_code == 3, (done.stdout, done.stderr)
    rid = json.loads(done.stdout)["request_id"]
    assert rid in done.stderr and "still pending" in done.stderr
    assert raw.hget(Names("bf").result(rid), "status") == b"pending"
    raw.close()
