"""Prometheus metrics for the gateway, in a registry of its own (one per app, so tests can
run several gateways in one process)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("batchfleet_gateway_requests_total", "HTTP requests",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("batchfleet_gateway_request_seconds", "HTTP request latency",
                                 ["method", "route"], registry=self.registry)
        self.submitted = Counter("batchfleet_gateway_submitted_total", "Requests submitted",
                                 ["model"], registry=self.registry)
        # Per API key: key IDs are few and configured, so the label set stays small.
        self.accepted = Counter("batchfleet_gateway_accepted_total",
                                "Requests admitted and enqueued, per API key", ["key"],
                                registry=self.registry)
        self.throttled = Counter("batchfleet_gateway_throttled_total",
                                 "Requests refused with 429, per API key and limit",
                                 ["key", "limit"], registry=self.registry)

    def install(self, app: FastAPI) -> None:
        @app.middleware("http")
        async def measure(request: Request,
                          call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            start = time.perf_counter()
            response = await call_next(request)
            route = getattr(request.scope.get("route"), "path", "unmatched")
            self.requests.labels(request.method, route, str(response.status_code)).inc()
            self.latency.labels(request.method, route).observe(time.perf_counter() - start)
            return response
