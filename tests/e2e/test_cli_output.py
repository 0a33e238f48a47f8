"""Listing commands print whole IDs in every format, and take -o and --no-headers alike."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.values import DeadLetter
from batchfleet.schemas.names import Names
from tests.e2e.test_cli_errors import COMMANDS
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

#: Longer than any column a narrow terminal could give it: it must fold, never be cut.
LONG_ID = "req-" + "0123456789abcdef" * 6


def _cli(*args: str, columns: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batchfleet", *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env=os.environ | {"COLUMNS": str(columns)})


async def _dead_letter(redis_url: str) -> None:
    client = redis_client(redis_url)
    try:
        await DeadLetterQueue(client, Names("bf")).add([DeadLetter(
            LONG_ID, "demo-mlp", b"", 3,
            [{"type": "model_error", "message": "boom", "retryable": True, "at": 1.7e9}],
            "retries exhausted")])
    finally:
        await client.aclose()


async def test_dlq_list_and_show_in_every_format(redis_url: str) -> None:
    await _dead_letter(redis_url)
    at = ("--broker", redis_url)
    table = _cli("dlq", "list", *at)
    assert table.returncode == 0, table.stderr
    assert LONG_ID in "".join(table.stdout.replace("│", "").split()), table.stdout
    as_json = json.loads(_cli("dlq", "list", *at, "-o", "json").stdout)
    assert [d["request_id"] for d in as_json] == [LONG_ID]
    assert as_json[0]["dead_at"].endswith("+00:00")  # ISO 8601 in JSON, never an epoch
    assert json.loads(_cli("dlq", "list", *at, "--json").stdout) == as_json  # the alias
    assert yaml.safe_load(_cli("dlq", "list", *at, "-o", "yaml").stdout) == as_json
    wide = _cli("dlq", "list", *at, "-o", "wide", "--no-headers", columns=400).stdout
    assert "request_id" not in wide and "retries exhausted" in wide
    assert wide.split()[0] == LONG_ID  # the first word of a row is the whole, copyable ID
    shown = _cli("dlq", "show", LONG_ID, *at)
    assert shown.returncode == 0 and "model_error" in shown.stdout and "boom" in shown.stdout
    assert "{" not in shown.stdout  # a table, not a Python dict
    assert json.loads(_cli("dlq", "show", LONG_ID, *at, "-o", "json").stdout)[0][
        "errors"][0]["message"] == "boom"


def test_bulk_list_formats_and_a_bad_format_is_usage(redis_url: str) -> None:
    at = ("--broker", redis_url)
    assert json.loads(_cli("bulk", "list", *at, "-o", "json").stdout) == []
    assert yaml.safe_load(_cli("bulk", "list", *at, "-o", "yaml").stdout) == []
    bad = _cli("bulk", "list", *at, "-o", "xml")
    assert bad.returncode == 2 and bad.stderr.startswith("error: -o/--output must be")


def test_result_json_on_an_unknown_id_is_json(redis_url: str) -> None:
    done = _cli("result", "no-such-id", "--broker", redis_url, "--json")
    body: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 4 and body == {"request_id": "no-such-id", "status": "unknown"}


@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_every_help_has_examples_and_no_bool_placeholder(name: str) -> None:
    """``--json <bool>`` reads as if ``--json true`` were the way to use it."""
    done = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "<bool>" not in done.output
    assert "Example" in done.output


def test_submit_wait_timeout_prints_the_queued_id(redis_url: str) -> None:
    """No worker yet (the model is declared): --wait gives up, but says which ID to ask."""
    at = ("--broker", redis_url)
    assert _cli("models", "declare", "demo-mlp", *at).returncode == 0
    done = _cli("submit", "-m", "demo-mlp", "--inputs", "[1.0]", "--wait", "0.5",
                "--request-id", "queued-1", *at)
    assert done.returncode == 3, done.stderr
    assert "request queued-1 is still pending" in done.stderr
    assert "batchfleet result queued-1" in done.stderr
    as_json = _cli("submit", "-m", "demo-mlp", "--inputs", "[1.0]", "--wait", "0.5",
                   "--request-id", "queued-2", "--json", *at)
    assert json.loads(as_json.stdout) == {"request_id": "queued-2", "status": "pending"}


def test_webhooks_failed_falls_back_to_the_broker_variable(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BATCHFLEET_RESULTS"}
    done = subprocess.run([sys.executable, "-m", "batchfleet", "webhooks", "failed", "-o",
                           "json"], capture_output=True, text=True, timeout=60, check=False,
                          env=env | {"BATCHFLEET_BROKER": redis_url})
    assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr


async def _acli(*args: str, columns: int = 60) -> tuple[int, str]:
    """The CLI in a child process while this loop keeps a worker running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=os.environ | {"COLUMNS": str(columns)})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    return proc.returncode, out.decode()


def _joined(text: str) -> str:
    """A table's text with borders and line breaks gone: a folded cell reads whole."""
    return "".join(text.replace("│", "").replace("┃", "").split())


async def test_status_and_rollout_status_in_every_format(redis_url: str) -> None:
    worker_id = "w-" + "0123456789abcdef" * 4  # longer than a 60-column terminal's cell
    at = ("--broker", redis_url)
    async with running_worker(redis_url, worker_id=worker_id):
        _, out = await _acli("status", *at, "--once", "--json")
        as_json = json.loads(out)
        _, out = await _acli("status", *at, "-o", "json")
        again = json.loads(out)  # the alias: the same document, the same keys
        assert list(again) == list(as_json) == ["taken_at", "namespace", "broker", "lanes",
                                                "workers", "totals", "paused"]
        assert [w["worker_id"] for w in again["workers"]] == [worker_id]
        _, out = await _acli("status", *at, "-o", "yaml")
        assert [w["worker_id"] for w in yaml.safe_load(out)["workers"]] == [worker_id]
        _, table = await _acli("status", *at, "--once")
        assert worker_id in _joined(table) and "depth" in table  # folded, never cut
        _, wide = await _acli("status", *at, "--once", "-o", "wide", "--no-headers",
                              columns=400)
        assert "depth" not in wide and "worker" not in wide.replace(worker_id, "")
        assert any(line.split()[0] == worker_id for line in wide.splitlines() if line.split())
        assert "demo-mlp" in wide and "interactive" in wide
        _, shown = await _acli("models", "show", "demo-mlp", *at)
        assert worker_id in _joined(shown) and "{" not in shown  # tables, not a dict

        _, out = await _acli("rollout", "status", "demo-mlp", *at, "--json")
        rollout = json.loads(out)
        _, out = await _acli("rollout", "status", "demo-mlp", *at, "-o", "yaml")
        assert list(yaml.safe_load(out)) == list(rollout)
        _, wide = await _acli("rollout", "status", "demo-mlp", *at, "-o", "wide")
        assert "worker IDs" in wide and worker_id in _joined(wide)
        _, bare = await _acli("rollout", "status", "demo-mlp", *at, "--no-headers")
        assert "version" not in bare and "epoch 0" not in bare and "default" in bare


def test_cancel_in_every_format(redis_url: str) -> None:
    at = ("--broker", redis_url)
    lines = _cli("cancel", LONG_ID, *at)
    assert lines.returncode == 4 and lines.stdout.startswith(f"{LONG_ID}: unknown")
    as_json = json.loads(_cli("cancel", LONG_ID, *at, "-o", "json").stdout)
    assert as_json == json.loads(_cli("cancel", LONG_ID, *at, "--json").stdout) == {
        "request_id": LONG_ID, "outcome": "unknown", "status": None}
    assert yaml.safe_load(_cli("cancel", LONG_ID, *at, "-o", "yaml").stdout) == [as_json]
    wide = _cli("cancel", LONG_ID, *at, "-o", "wide", "--no-headers", columns=400).stdout
    assert wide.split()[:2] == [LONG_ID, "unknown"] and "request_id" not in wide
