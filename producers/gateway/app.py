"""The HTTP gateway: submit, poll and long-poll over HTTP, on top of ``AsyncClient``.

It is a thin shell around the SDK, so HTTP and Python callers share one
contract: a request submitted here can be waited for with ``Client.wait`` and
the reverse. ``create_app`` only wires the pieces; the routes live in
``producers.gateway.routes`` and reach the shared state through ``Gateway``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI

from batchfleet.connectors import BrokerURL, open_control_plane, results_url_for
from batchfleet.producers.admission import AdmissionLimits
from batchfleet.producers.client import AsyncClient
from batchfleet.producers.gateway import problems
from batchfleet.producers.gateway.metrics import GatewayMetrics
from batchfleet.producers.gateway.routes import Gateway, operations, requests
from batchfleet.producers.gateway.routes_admin import admin
from batchfleet.producers.gateway.routes_models import models
from batchfleet.producers.gateway.settings import GatewaySettings

log = structlog.get_logger("batchfleet.gateway")


def create_app(settings: GatewaySettings, host: str = "127.0.0.1") -> FastAPI:
    """``host``: where the server listens (the console's cookie is ``Secure`` off loopback)."""
    settings = settings.validated()
    results_url = results_url_for(BrokerURL.parse(settings.broker), settings.results)
    metrics = GatewayMetrics()
    console = _console(settings, host) if settings.console else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.id_secret is None:  # here, not at build time: `gateway openapi` is quiet
            log.warning("no BATCHFLEET_GATEWAY_ID_SECRET set: using a random one, so an "
                        "Idempotency-Key retried after a restart or on another replica gets "
                        "a new request ID and runs again")
            id_secret = secrets.token_bytes(32)
        else:
            id_secret = settings.id_secret.encode()
        client = AsyncClient(settings.broker, settings.results, namespace=settings.namespace,
                             result_ttl_s=settings.result_ttl_s,
                             callback_policy=settings.callback_policy,
                             redis_max_connections=settings.redis_max_connections,
                             admission=AdmissionLimits(settings.admit_max_memory,
                                                       settings.admit_max_backlog),
                             model_list_ttl_s=settings.model_list_ttl_s)
        # Its own plane, for readiness, ownership reads and quotas.
        plane = open_control_plane(
            results_url, namespace=settings.namespace,
            result_ttl_s=settings.result_ttl_s,  # quota slots live as long as records
            max_connections=settings.redis_max_connections)
        app.state.gateway = Gateway(settings, client, plane, metrics, id_secret)
        try:
            if console is not None:
                async with console.state.lifespan(console):
                    yield
            else:
                yield
        finally:
            await client.close()
            await plane.close()

    app = FastAPI(title="batchfleet gateway", version="1", lifespan=lifespan,
                  description="Submit inference requests, poll or long-poll their results. "
                              "See docs/http-api.md.")
    problems.install(app)
    metrics.install(app)
    app.include_router(requests)
    app.include_router(operations)
    app.include_router(models)
    app.include_router(admin)
    if console is not None:
        app.mount("/console", console)
    return app


def _console(settings: GatewaySettings, host: str) -> FastAPI:
    """The console app over the gateway's broker and keys (FastAPI is here already)."""
    from batchfleet.producers.console.app import create_console_app
    from batchfleet.producers.console.sessions import KeySource
    from batchfleet.producers.console.settings import ConsoleSettings

    return create_console_app(
        ConsoleSettings(broker=settings.broker, results=settings.results,
                        namespace=settings.namespace, host=host),
        KeySource(fixed=settings.keys))
