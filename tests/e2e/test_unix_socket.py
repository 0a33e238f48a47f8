"""A fleet over a Unix socket (``unix://``): a worker process, a client and the CLI, all
co-located with their Redis.

``unix://`` was accepted by every URL check and listed among the schemes, yet every
asyncio client over it failed on its first command (redis-py's Unix connection refuses
``socket_keepalive``, a TCP option we set for every URL): a worker died at start-up.
The server's own client list shows the connections really came over the socket.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.models.builtin import build_mlp

pytestmark = pytest.mark.e2e


def _socket_clients(server: EmbeddedRedis) -> list[str]:
    """The names of the clients connected over the server's Unix socket now."""
    with redis.Redis.from_url(server.url) as admin:
        return [c.get("name", "") for c in admin.client_list()
                if str(c.get("addr", "")).startswith("/")]


async def test_a_worker_process_and_a_client_over_a_unix_socket(
        redis_server: EmbeddedRedis) -> None:
    url = redis_server.unix_url
    x = np.random.default_rng(5).random((300, 10), dtype=np.float32)
    worker = WorkerProcess(url, extra_args=("--max-batch-size", "64"))
    with worker:
        await asyncio.to_thread(worker.wait_ready)
        async with AsyncClient(url) as client:
            results = await client.wait_many(await client.submit_many("demo-mlp", x), 60)
            assert worker.alive, worker.log_tail()
            over_socket = _socket_clients(redis_server)
    assert [r.status for r in results] == ["succeeded"] * len(x)
    model = build_mlp()
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = np.stack([np.asarray(r.outputs) for r in results]).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # the worker and the client had only the socket's address, and the server saw it used
    assert len(over_socket) >= 2, over_socket


def test_the_cli_reads_a_fleet_over_a_unix_socket(redis_server: EmbeddedRedis) -> None:
    url = redis_server.unix_url
    with WorkerProcess(url) as worker:
        worker.wait_ready()
        done = subprocess.run(
            [sys.executable, "-m", "batchfleet", "status", "--once", "--json", "--broker", url],
            capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert worker.worker_id in done.stdout


def test_a_data_directory_too_deep_for_a_socket_still_starts_over_tcp(
        tmp_path: Path) -> None:
    server = EmbeddedRedis()
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    server.dir.rmdir()  # its own, still empty: replaced before the start
    server.dir = deep
    assert server.socket_path is None
    assert "--unixsocket" not in server.command()
    with pytest.raises(ConfigError, match="too long"):
        _ = server.unix_url
    with server, redis.Redis.from_url(server.url) as plain:
        assert plain.ping()
