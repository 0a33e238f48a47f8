"""``live_gateway()``: a real uvicorn server on a free loopback port, in a thread;
``gateway_process()``: ``batchfleet gateway`` as a child process (one replica)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from batchfleet.connectors.embedded_server import free_port
from batchfleet.producers.gateway import GatewaySettings, create_app


@contextmanager
def live_gateway(settings: GatewaySettings) -> Iterator[str]:
    """Serve ``settings`` with uvicorn on 127.0.0.1; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


@contextmanager
def gateway_process(broker: str, keys: str, *args: str, **env: str) -> Iterator[str]:
    """``batchfleet gateway`` in its own process (a replica); yields the base URL once
    /readyz answers, and stops it with SIGTERM."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchfleet", "gateway", "--broker", broker,
         "--port", str(port), "--log-level", "warning", *args],
        env={**os.environ, "BATCHFLEET_GATEWAY_KEYS": keys, **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise RuntimeError(f"gateway exited {proc.returncode}: {err.decode()[-2000:]}")
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("gateway process did not become ready in 30s")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
