"""The submit and result commands, run as a user would, against a real worker."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_submit_wait_and_result_from_the_shell(redis_url: str) -> None:
    async with running_worker(redis_url):
        code, out, _ = await _cli("submit", "-m", "demo-mlp", "--broker", redis_url,
                                  "--inputs", "[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]",
                                  "--wait", "10", "--json")
        assert code == 0, out
        done = json.loads(out)
        assert done["status"] == "succeeded" and len(done["outputs"]) == 1
        code, out, _ = await _cli("result", done["request_id"], "--broker", redis_url, "--json")
        assert code == 0 and json.loads(out)["outputs"] == done["outputs"]
        # whole numbers are int64 unless --dtype says otherwise: a clear failure, exit 1
        code, out, _ = await _cli("submit", "-m", "demo-mlp", "--broker", redis_url,
                                  "--inputs", "[0,1,2,3,4,5,6,7,8,9]", "--wait", "10", "--json")
        assert code == 1 and "wrong dtype: expected float32, got int64" in out
        code, out, _ = await _cli("submit", "-m", "demo-mlp", "--broker", redis_url,
                                  "--inputs", "[0,1,2,3,4,5,6,7,8,9]", "--dtype", "float32",
                                  "--wait", "10", "--json")
        assert code == 0 and json.loads(out)["status"] == "succeeded"
        code, _, err = await _cli("result", "no-such-id", "--broker", redis_url)
        assert code == 4 and "unknown request" in err
        code, _, err = await _cli("submit", "-m", "nope", "--broker", redis_url,
                                  "--inputs", "[1.0]")
        assert code == 1 and "no worker serves model 'nope'" in err
