"""The HTTP gateway: submit, poll and long-poll over HTTP, on top of ``AsyncClient``.

It is a thin shell around the SDK, so HTTP and Python callers share one
contract: a request submitted here can be waited for with ``Client.wait`` and
the reverse. ``create_app`` only wires the pieces; the routes live in
``producers.gateway.routes`` and reach the shared state through ``Gateway``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from connectors import BrokerURL, open_result_store, results_url_for
from producers.client import AsyncClient
from producers.gateway import problems
from producers.gateway.metrics import GatewayMetrics
from producers.gateway.routes import Gateway, operations, requests
from producers.gateway.settings import GatewaySettings
from schemas.names import Names


def create_app(settings: GatewaySettings) -> FastAPI:
    settings = settings.validated()
    results_url = results_url_for(BrokerURL.parse(settings.broker), settings.results)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncClient(settings.broker, settings.results, namespace=settings.namespace,
                             result_ttl_s=settings.result_ttl_s,
                             callback_policy=settings.callback_policy)
        # Its own store handle, for readiness and for batched "does this ID exist" reads.
        store = open_result_store(results_url, Names(settings.namespace))
        app.state.gateway = Gateway(settings, client, store, metrics)
        try:
            yield
        finally:
            await client.close()
            await store.close()

    app = FastAPI(title="batchfleet gateway", version="1", lifespan=lifespan,
                  description="Submit inference requests, poll or long-poll their results. "
                              "See docs/http-api.md.")
    problems.install(app)
    metrics.install(app)
    app.include_router(requests)
    app.include_router(operations)
    return app
