"""The submit, result and worker commands, run as a user would, against a real worker."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from tests.support.fleet import running_worker

pytestmark = pytest.mark.e2e


async def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "batchfleet", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=None if env is None else os.environ | env)
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
        assert code == 2 and "no worker serves model 'nope'" in err  # refused: nothing sent


async def test_worker_print_config_redacts_secrets_and_resolves_per_model_values() -> None:
    """The settings a worker would start with, from flags and the environment, then exit 0."""
    code, out, err = await _cli(
        "worker", "--broker", "redis://:s3cret@redis.example:6379/0", "-m", "demo-mlp",
        "-m", "demo-encoder", "--retry", "4", "--kafka-partitions", "8", "--print-config",
        env={"BATCHFLEET_RETRY": "demo-encoder=2", "BATCHFLEET_MAX_WAIT_MS": "9"})
    assert code == 0, err
    lines = out.splitlines()
    assert "s3cret" not in out and "broker = redis://:***@redis.example:6379/0  # flag --broker" \
        in lines
    # the flag replaces the variable's entries: --retry 4 now applies to every model
    assert "retry = 4  # flag --retry" in lines
    assert "retry[demo-mlp] = 4" in lines and "retry[demo-encoder] = 4" in lines
    assert "max_wait_ms = 9.0  # env BATCHFLEET_MAX_WAIT_MS" in lines
    assert "kafka_partitions = 8  # flag --kafka-partitions" in lines
    code, _, err = await _cli("worker", "--broker", "redis://h:1/0", "--retry", "nope=2",
                              "--print-config")
    assert code == 2 and "--retry names 'nope'" in err and "Traceback" not in err
