"""Serving one's own model (docs/models.md), with real worker processes and Redis.

A ``module:factory`` under the working directory (or ``--app-dir``) loads with no
``PYTHONPATH``; a declared input spec (``--input-spec`` or ``models declare``) makes a
wrong shape a ``validation_error`` at intake: one attempt, no DLQ entry; a model with no
spec is served as before and the worker says so once; a TorchScript error keeps the line
with the real error.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from batchfleet.connectors.dlq_ops import DeadLetterOps
from batchfleet.producers import AsyncClient
from batchfleet.schemas.envelopes import Result
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e
FACTORY = """\
import torch


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.ReLU())
"""


#: The console script, as a user runs it: unlike ``python -m``, it does not put the working
#: directory on ``sys.path`` (its own is its ``bin/`` folder).
BATCHFLEET = (str(Path(sys.executable).with_name("batchfleet")),)


def _write_app(folder: Path) -> Path:
    (folder / "ownmodel").mkdir(parents=True)
    (folder / "ownmodel" / "__init__.py").write_text(FACTORY)
    return folder


def _env() -> dict[str, str]:
    """The test's environment: batchfleet importable as installed (here, possibly through
    PYTHONPATH to the checkout), the user's folder not on the path."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@asynccontextmanager
async def _worker(redis_url: str, ns: str, cwd: Path, *args: str
                  ) -> AsyncIterator[list[str]]:
    """``batchfleet worker`` in ``cwd``; yields the log lines read so far (kept up to date)."""
    proc = await asyncio.create_subprocess_exec(
        *BATCHFLEET, "worker", "--broker", redis_url, "--namespace",
        ns, "--device", "cpu", "--no-webhooks", "--log-format", "json", "--retry-base-s",
        "0.01", *args, cwd=cwd, env=_env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            lines.append(line.decode())

    reader = asyncio.create_task(read())
    try:
        for _ in range(1200):  # liveness only: start-up imports torch
            if any("worker ready" in line for line in lines) or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert any("worker ready" in line for line in lines), "".join(lines)[-3000:]
        yield lines
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await asyncio.wait_for(reader, 10)


async def _dead_letters(redis_url: str, ns: str) -> list[str]:
    ops = DeadLetterOps(redis_url, None, namespace=ns)
    try:
        return [dl.request_id for dl in await ops.letters()]
    finally:
        await ops.close()


def _refused(result: Result) -> None:
    assert result.status == "failed" and result.error is not None, result
    assert result.error.type == "validation_error" and not result.error.retryable
    assert "wrong shape: expected float32[10], got float32[7]" in result.error.message
    assert result.attempts == 1


async def test_a_factory_in_the_working_directory_with_an_input_spec(
        redis_url: str, tmp_path: Path) -> None:
    """No PYTHONPATH names the user's folder; ``--input-spec`` refuses a wrong shape at
    intake, for a plain module and a ``.pt2`` file (enqueued before the worker started,
    past the SDK's checks)."""
    import torch

    app = _write_app(tmp_path / "app")
    assert str(app) not in os.environ.get("PYTHONPATH", "")
    batch = torch.export.Dim("batch")
    exported = torch.export.export(torch.nn.Linear(10, 2), (torch.zeros(2, 10),),
                                   dynamic_shapes=({0: batch},))
    torch.export.save(exported, str(app / "exp.pt2"))
    ns = "own1"
    for model in ("lin", "exp"):
        code, _, err = await run_cli("models", "declare", model, "--broker", redis_url,
                                     "--namespace", ns)
        assert code == 0, err
    async with AsyncClient(redis_url, namespace=ns) as client:
        good = await client.submit("lin", [0.5] * 10)
        bad = await client.submit("lin", [0.5] * 7)
        exp_bad = await client.submit("exp", [0.5] * 7)
        async with _worker(redis_url, ns, app, "--model", "lin=ownmodel:build", "--model",
                           "exp=exp.pt2", "--input-spec", "lin=float32[10]",
                           "--input-spec", "exp=float32[10]") as lines:
            done = await client.wait_many([good, bad, exp_bad], timeout=60)
            exp_good = await client.wait(await client.submit("exp", [0.5] * 10), timeout=60)
    assert done[0].status == "succeeded" and done[0].outputs is not None
    _refused(done[1])
    _refused(done[2])
    assert exp_good.status == "succeeded"
    assert await _dead_letters(redis_url, ns) == []
    assert not any("no input spec" in line for line in lines)


async def test_app_dir_a_declared_spec_and_a_model_with_none(
        redis_url: str, tmp_path: Path) -> None:
    """``--app-dir`` from another folder; the spec from ``models declare`` refuses at
    intake; a TorchScript file with no spec is served unchecked, logged once, and its
    error says what failed."""
    import torch

    app = _write_app(tmp_path / "app")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(10, 2)))
    torch.jit.save(scripted, str(elsewhere / "ts.pt"))  # type: ignore[no-untyped-call]
    ns = "own2"
    at = ("--broker", redis_url, "--namespace", ns)
    for model in ("lin", "ts"):
        assert (await run_cli("models", "declare", model, *at))[0] == 0
    async with AsyncClient(redis_url, namespace=ns) as client:
        bad = await client.submit("lin", [0.5] * 7)  # declared without a spec: accepted
        ts_bad = await client.submit("ts", [0.5] * 7)
        code, _, err = await run_cli("models", "declare", "lin", "--input", "float32[10]", *at)
        assert code == 0, err
        async with _worker(redis_url, ns, elsewhere, "--app-dir", str(app), "--model",
                           "lin=ownmodel:build", "--model", "ts=ts.pt",
                           "--retry", "ts=1") as lines:
            done = await client.wait_many([bad, ts_bad], timeout=60)
            good = await client.wait(await client.submit("ts", [0.5] * 10), timeout=60)
    _refused(done[0])
    ts = done[1]
    assert ts.status == "failed" and ts.error is not None and ts.error.type == "model_error"
    assert "mat1 and mat2 shapes cannot be multiplied" in ts.error.message
    assert "The following operation failed" not in ts.error.message
    assert good.status == "succeeded"
    assert await _dead_letters(redis_url, ns) == [ts_bad]
    unchecked = [line for line in lines if "no input spec" in line]
    assert len(unchecked) == 1 and '"ts"' in unchecked[0] and '"lin"' not in unchecked[0]
