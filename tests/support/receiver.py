"""A real local webhook receiver: http.server in a thread, recording every POST.

It can be stopped and started again on the same port, to play a receiver that is
down for a while."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from batchfleet.connectors.embedded_server import free_port


@dataclass(frozen=True, slots=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = field(default_factory=free_port)
    status: int = 200
    deliveries: list[Delivery] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._arrived = threading.Condition(self._lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._arrived:
                    receiver.deliveries.append(Delivery(self.path, dict(self.headers), body))
                    receiver._arrived.notify_all()
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, count: int, timeout: float) -> list[Delivery]:
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.deliveries) >= count, timeout)
            return list(self.deliveries)
