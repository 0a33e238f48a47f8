"""``/metrics``, ``/healthz`` and ``/readyz`` over a deliberately tiny HTTP/1.1 server.

Three GET endpoints do not justify a web framework in every worker, so this
answers them straight from ``asyncio.start_server`` on the worker's own loop:

* ``/healthz``: the process is alive and its loop is turning (always 200);
* ``/readyz``: 200 only when the models are warmed, broker and result store
  answer and no circuit breaker is open; 503 with the reasons otherwise;
* ``/metrics``: the Prometheus exposition of this worker's registry.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from batchfleet.connectors.cancelling import bounded
from batchfleet.schemas.errors import ConfigError

log = structlog.get_logger("batchfleet.health")

Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class HealthServer:
    def __init__(self, host: str, port: int, metrics: Callable[[], bytes],
                 readiness: Readiness) -> None:
        self._host, self._port = host, port
        self._metrics = metrics
        self._readiness = readiness
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0). A port that cannot be bound
        is a :class:`ConfigError`: the worker binds it before anything else starts."""
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:  # the port is taken, or the host is not ours
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise ConfigError(f"--metrics-port {self._port}: cannot listen on "
                              f"{self._host}:{self._port}: {reason}") from exc
        port = int(self._server.sockets[0].getsockname()[1])
        log.info("health and metrics listening", host=self._host, port=port)
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await bounded(reader.readuntil(b"\r\n\r\n"), 5.0)
            words = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            method, path = (words[0], words[1]) if len(words) > 1 else ("", "")
            status, ctype, body = await self._route(method, path.split("?", 1)[0])
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass  # a client that hung up or sent garbage gets nothing
        finally:
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"only GET\n"
        if path == "/metrics":
            return 200, _CONTENT_TYPE_METRICS, self._metrics()
        if path == "/healthz":
            return 200, "application/json", b'{"status":"alive"}\n'
        if path == "/readyz":
            ready, details = await self._readiness()
            body = json.dumps({"ready": ready, **details}).encode() + b"\n"
            return (200 if ready else 503), "application/json", body
        return 404, "text/plain", b"try /metrics, /healthz or /readyz\n"
