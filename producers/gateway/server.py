"""Running the gateway under uvicorn (the CLI's ``batchfleet gateway``)."""

from __future__ import annotations

import uvicorn

from batchfleet.producers.gateway.app import create_app
from batchfleet.producers.gateway.settings import GatewaySettings


def serve(settings: GatewaySettings, host: str = "127.0.0.1", port: int = 8080,
          log_level: str = "info") -> None:
    """Blocks until SIGINT/SIGTERM; uvicorn drains open requests, then the app closes."""
    uvicorn.run(create_app(settings, host), host=host, port=port, log_level=log_level,
                proxy_headers=False, server_header=False)
