"""Which extras each command really needs (issue 25, item 12): the command runs in a child
process where the heavy modules cannot be imported, as on an install without that extra.

Listing failed webhooks needs rq (the ``webhooks`` extra), never torch; ``gateway
hash-key`` needs no extra; ``bulk run`` on a JSONL file needs no pyarrow, while Parquet
still names the ``bulk`` extra in one line."""

from __future__ import annotations

import asyncio
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from batchfleet.options import COMMAND_EXTRAS, extra_for
from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "pyarrow", "aiokafka", "matplotlib",
         "onnxruntime")
#: Runs the CLI with ``blocked`` modules unimportable (None in sys.modules: ImportError).
_RUNNER = ("import runpy, sys; blocked, sys.argv = sys.argv[1], ['batchfleet', *sys.argv[2:]]; "
           "sys.modules.update(dict.fromkeys(blocked.split(','))); "
           "runpy.run_module('batchfleet', run_name='__main__')")


async def _without(blocked: tuple[str, ...], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RUNNER, ",".join(blocked), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def test_the_webhooks_extra_brings_no_torch() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert not any(r.startswith("torch") for r in extras["webhooks"])
    assert COMMAND_EXTRAS["webhooks"] == "webhooks" and extra_for("webhooks", "rq") == "webhooks"


async def test_webhooks_failed_needs_only_rq(redis_url: str) -> None:
    code, out, err = await _without(HEAVY, "webhooks", "failed", "--results", redis_url,
                                    "-o", "json")
    assert code == 0, err
    assert json.loads(out) == []


async def test_gateway_hash_key_needs_no_extra() -> None:
    code, out, err = await _without((*HEAVY, "httpx", "prometheus_client"),
                                    "gateway", "hash-key", "--id", "ci")
    assert code == 0, err
    assert out.startswith("ci:") and "bfk_" in err


async def test_bulk_on_jsonl_needs_no_pyarrow_and_parquet_names_the_extra(
        redis_url: str, tmp_path: Path) -> None:
    with (tmp_path / "in.jsonl").open("w") as f:
        for row in np.random.default_rng(2).random((8, 10)):
            f.write(json.dumps({"inputs": row.tolist()}) + "\n")
    async with running_worker(redis_url):
        code, _, err = await _without(HEAVY, "bulk", "run", "-m", "demo-mlp",
                                      "-i", str(tmp_path / "in.jsonl"),
                                      "-o", str(tmp_path / "out.jsonl"),
                                      "--broker", redis_url, "--progress", "none", "--json")
    assert code == 0, err
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 8
    (tmp_path / "in.parquet").write_bytes(b"PAR1")
    code, _, err = await _without(HEAVY, "bulk", "run", "-m", "demo-mlp",
                                  "-i", str(tmp_path / "in.parquet"),
                                  "-o", str(tmp_path / "out.parquet"), "--broker", redis_url)
    assert code == 2 and "pip install 'batchfleet[bulk]'" in err
