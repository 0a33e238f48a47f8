"""Every command that takes a URL refuses a malformed one in one line, exit 2, stdout empty.

`status --broker redis:/127.0.0.1:16379/0` (one slash) once reached redis-py, which read
"no host" as localhost:6379, a different Redis: it printed "no live workers" and exited 0.
Now every URL goes through ``connectors.urls`` before anything dials. The whole matrix
(command x spelling) runs in process; one real process per command proves the streams.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchfleet.cli import app

pytestmark = pytest.mark.e2e

#: One slash, no host, bad port, bad db, unknown scheme, an empty cluster list.
SPELLINGS = ("redis:/127.0.0.1:6379/0", "redis:///0", "redis://127.0.0.1:notaport/0",
             "redis://127.0.0.1:6379/x", "http://127.0.0.1:6379/0", "redis+cluster://")
#: Each command with the arguments it needs to reach its URL; ``{url}`` is the bad one.
COMMANDS: dict[str, tuple[str, ...]] = {
    "worker": ("worker", "-m", "demo-mlp", "--broker", "{url}"),
    "submit": ("submit", "-m", "demo-mlp", "--inputs", "[1.0]", "--broker", "{url}"),
    "result": ("result", "some-id", "--broker", "{url}"),
    "status": ("status", "--once", "--broker", "{url}"),
    "dlq list": ("dlq", "list", "--broker", "{url}"),
    "bulk run": ("bulk", "run", "-m", "demo-mlp", "-i", "{tmp}/rows.jsonl", "--out",
                 "{tmp}/out.jsonl", "--progress", "none", "--broker", "{url}"),
    "gateway": ("gateway", "--broker", "{url}"),
    "webhooks worker": ("webhooks", "worker", "--secret", "s3cret", "--burst",
                        "--results", "{url}"),
    "bench": ("bench", "--quick", "--redis", "{url}"),
    "webhook Redis of worker": ("worker", "-m", "demo-mlp", "--broker", "redis://127.0.0.1:1/0",
                                "--webhook-redis-url", "{url}"),
    "results of submit": ("submit", "-m", "demo-mlp", "--inputs", "[1.0]", "--broker",
                          "redis://127.0.0.1:1/0", "--results", "{url}"),
}
#: Nothing from the environment may stand in for the URL given.
CLEAN_ENV = {name: None for name in ("BATCHFLEET_BROKER", "BATCHFLEET_RESULTS",
                                     "BATCHFLEET_DEBUG", "BATCHFLEET_GATEWAY_KEYS")}


def _args(name: str, url: str, tmp: Path) -> list[str]:
    (tmp / "rows.jsonl").write_text('{"inputs": [1.0]}\n')
    return [a.format(url=url, tmp=tmp) for a in COMMANDS[name]]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_malformed_url_is_one_line_and_exit_2_in_every_command(
        name: str, tmp_path: Path) -> None:
    runner = CliRunner()
    for url in SPELLINGS:
        done = runner.invoke(app, _args(name, url, tmp_path), env={**CLEAN_ENV,
                                                                    "COLUMNS": "200"})
        lines = done.stderr.strip().splitlines()
        assert done.exit_code == 2, (url, done.stdout, done.stderr)
        assert done.stdout == "", (url, done.stdout)
        assert len(lines) == 1 and lines[0].startswith("error: ") and "URL" in lines[0], (
            url, lines)
        assert "no live workers" not in done.stderr


#: The commands of the reports (status answered from localhost, worker's traceback), in
#: real processes; the in-process matrix above covers the rest.
IN_A_PROCESS = ("status", "worker", "submit", "gateway")


@pytest.mark.parametrize(("name", "url"), [
    (name, SPELLINGS[i % len(SPELLINGS)]) for i, name in enumerate(IN_A_PROCESS)])
def test_a_real_process_refuses_it_before_connecting_anywhere(
        name: str, url: str, tmp_path: Path) -> None:
    """stdout empty, one stderr line, exit 2: nothing dialled the default localhost:6379
    (a connection would have answered, or failed with a connection error instead)."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    done = subprocess.run([sys.executable, "-m", "batchfleet", *_args(name, url, tmp_path)],
                          capture_output=True, text=True, env=env, timeout=90, check=False)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and repr(url) in line, line
