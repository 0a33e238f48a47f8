"""The console web app: one page, its static files (uPlot, served from the wheel), and
the JSON it polls. ``batchfleet console`` serves it; the gateway mounts it at
``/console/`` with ``--console`` (then the gateway's own keys sign in).

Reads need a session (an admin key exchanged for a cookie, or an ``X-API-Key`` header)
unless the console is open on loopback without keys; the actions need the CSRF token
too (``sessions``). The page polls ``api/overview`` every ``refresh_s``; pages polling
together share one read (``reads``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Annotated, Any

from fastapi import Cookie, FastAPI, Header, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from batchfleet.connectors import BrokerURL, open_broker, open_control_plane, results_url_for
from batchfleet.connectors.control_plane import ControlPlane
from batchfleet.producers.console.actions import Actions
from batchfleet.producers.console.reads import DLQ_PAGE, ConsoleReads
from batchfleet.producers.console.sessions import (
    COOKIE,
    CSRF_HEADER,
    SESSION_S,
    KeySource,
    Sessions,
)
from batchfleet.producers.console.settings import ConsoleSettings, is_loopback
from batchfleet.producers.gateway import problems
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.validation import check_model_name

STATIC = files("batchfleet.producers.console") / "static"
#: Module-level: FastAPI resolves these (string) annotations in the module's namespace.
CookieDep = Annotated[str | None, Cookie(alias=COOKIE)]
KeyDep = Annotated[str | None, Header(alias="X-API-Key")]
CsrfDep = Annotated[str | None, Header(alias=CSRF_HEADER)]


@dataclass(slots=True)
class ConsoleState:
    plane: ControlPlane
    reads: ConsoleReads
    actions: Actions


def create_console_app(settings: ConsoleSettings, keys: KeySource | None) -> FastAPI:
    """``keys`` None: open to anyone who reaches it (only for a loopback bind). Mounted in
    another app (the gateway's ``--console``), that app's lifespan must enter this one's:
    ``app.state.lifespan(app)``, as sub-application lifespans do not run on their own."""
    if keys is None and not settings.loopback:
        raise ConfigError(f"the console on {settings.host} needs API keys (--keys-file)")
    if settings.refresh_s < 1:
        raise ConfigError("the console's refresh must be at least 1 s")
    sessions = Sessions(keys)
    state: dict[str, ConsoleState] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        broker_url = BrokerURL.parse(settings.broker)
        plane = open_control_plane(results_url_for(broker_url, settings.results),
                                   namespace=settings.namespace)
        broker = open_broker(broker_url.url, namespace=settings.namespace)
        reads = ConsoleReads(plane, broker, cache_s=min(1.0, settings.refresh_s / 2))
        state["s"] = ConsoleState(plane, reads, Actions(
            plane, broker, settings.broker, settings.results, settings.namespace))
        try:
            yield
        finally:
            await reads.close()
            await plane.close()

    app = FastAPI(title="batchfleet console", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.lifespan = lifespan
    problems.install(app)
    if sessions.open:
        _loopback_names_only(app)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        html = (STATIC / "index.html").read_text()
        return HTMLResponse(html.replace("{{REFRESH_MS}}", str(int(settings.refresh_s * 1000))),
                            headers={"Cache-Control": "no-store"})

    @app.get("/api/session")
    async def who(cookie: CookieDep = None, key: KeyDep = None) -> dict[str, Any]:
        s = sessions.check(cookie, key)
        return {"who": s.who, "csrf": sessions.csrf(s), "open": sessions.open}

    @app.post("/api/session")
    async def sign_in(body: dict[str, Any], response: Response) -> dict[str, Any]:
        s = sessions.sign_in(str(body.get("key") or "") or None)
        response.set_cookie(COOKIE, s.cookie, max_age=SESSION_S, httponly=True,
                            samesite="strict", secure=not settings.loopback)
        return {"who": s.who, "csrf": sessions.csrf(s), "open": sessions.open}

    @app.delete("/api/session", status_code=204)
    async def sign_out(response: Response) -> None:
        response.delete_cookie(COOKIE)

    @app.get("/api/overview")
    async def overview(cookie: CookieDep = None, key: KeyDep = None) -> dict[str, Any]:
        sessions.check(cookie, key)
        st = state["s"]
        return {**await st.reads.overview(), "actions": st.actions.log(),
                "refresh_s": settings.refresh_s}

    @app.get("/api/dlq")
    async def dead_letters(
        model: str, cookie: CookieDep = None, key: KeyDep = None,
        before: Annotated[str, Query(pattern=r"^(\d{1,20}-\d{1,20})?$")] = "",
        limit: Annotated[int, Query(ge=1, le=200)] = DLQ_PAGE,
    ) -> dict[str, Any]:
        sessions.check(cookie, key)
        check_model_name(model)
        return await state["s"].reads.dead_letters(model, before, limit)

    @app.post("/api/actions/{action}")
    async def act(action: str, body: dict[str, Any], cookie: CookieDep = None,
                  key: KeyDep = None, csrf: CsrfDep = None) -> dict[str, Any]:
        s = sessions.check(cookie, key)
        sessions.check_csrf(s, csrf)
        return await state["s"].actions.run(action, body, s.who)

    return app


def _host_of(authority: str) -> str:
    """``host[:port]`` or ``[v6][:port]`` -> the host alone."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def _loopback_names_only(app: FastAPI) -> None:
    """An open console (loopback, no keys) answers only requests addressed to a loopback
    name, and takes actions only from a loopback origin. Why: a web page the operator
    visits can rebind its own DNS name to 127.0.0.1 and so reach the console as a
    same-origin page (DNS rebinding); its requests still carry that name in ``Host``
    and ``Origin``, which is what this refuses."""

    @app.middleware("http")
    async def loopback_only(request: Request, call_next: Any) -> Any:
        host = _host_of(request.headers.get("host", ""))
        origin = request.headers.get("origin")
        from_elsewhere = origin is not None and not is_loopback(
            _host_of(origin.partition("://")[2].partition("/")[0]))
        if not is_loopback(host) or (request.method not in ("GET", "HEAD") and from_elsewhere):
            return JSONResponse(
                {"type": "forbidden", "title": "Forbidden", "status": 403,
                 "detail": "this console is open without keys, so it answers only "
                           "requests addressed to localhost, 127.0.0.1 or [::1]"},
                status_code=403, media_type="application/problem+json")
        return await call_next(request)
