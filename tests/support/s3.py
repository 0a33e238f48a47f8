"""A real S3-compatible server for tests: moto's server mode, as a subprocess on a free port.

A subprocess, not moto's ``ThreadedMotoServer``: pyarrow's S3 client can block
while holding the GIL (an output stream closed from its destructor does), and a
server thread in the same process then never answers. Import the fixtures into
a test module (``s3_server = s3_support.s3_server``, and ``moto_s3`` likewise).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

#: moto accepts any credentials; these keep the AWS SDK from looking further.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def env(self) -> dict[str, str]:
        """The environment a ``batchfleet bulk`` subprocess needs to reach this server."""
        return {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def filesystem(self) -> Any:
        import pyarrow.fs as pafs

        host = self.endpoint.removeprefix("http://")
        return pafs.S3FileSystem(access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                 secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                 region=CREDENTIALS["AWS_REGION"], endpoint_override=host,
                                 scheme="http", allow_bucket_creation=True)


@contextlib.contextmanager
def moto_server(timeout: float = 30.0) -> Iterator[S3Server]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"moto server not up in {timeout}s") from None
                time.sleep(0.05)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """One moto server per test module (about 1 s to start); tests use their own buckets."""
    # no skip: `make install` brings moto[server] (the test extra), and a missing
    # server must fail CI rather than quietly drop the S3 tests
    with moto_server() as server:
        yield server


@pytest.fixture
def moto_s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with the AWS_* variables set for code that runs in this process."""
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_server.endpoint}.items():
        monkeypatch.setenv(key, value)
    return s3_server
