"""The gateway's routes. Auth runs first (a dependency), so a refused request never
touches Redis. Idempotency comes from the result store: with an ``Idempotency-Key``
the request ID is a hash of (API key id, idempotency key), and an ID that already
has a record is answered with that ID and not submitted again."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from connectors import ResultStore
from producers.client import AsyncClient
from producers.gateway.auth import ApiKey
from producers.gateway.bodies import Submission, decode_body, parse_submission, read_limited
from producers.gateway.metrics import GatewayMetrics
from producers.gateway.models import (
    Accepted,
    BatchAccepted,
    ErrorResponse,
    Health,
    ResultOut,
    body_schema,
)
from producers.gateway.settings import GatewaySettings
from schemas.errors import (
    RequestNotFoundError,
    ResultStoreError,
    UnknownModelError,
    ValidationError,
    WaitTimeoutError,
)
from schemas.json_form import result_to_json
from schemas.names import check_model_name, check_request_id

API_KEY_HEADER = "X-API-Key"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True, slots=True)
class Gateway:
    """What the routes share, created in the app's lifespan."""

    settings: GatewaySettings
    client: AsyncClient
    store: ResultStore
    metrics: GatewayMetrics

    async def existing(self, ids: Sequence[str]) -> list[bool]:
        """Which IDs already have a record: those are answered, never submitted again."""
        return [body is not None for body in await self.store.get_bodies(ids)]


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


_key_header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False,
                           description="An API key; see docs/http-api.md")


def _authenticated(request: Request,
                   key: Annotated[str | None, Depends(_key_header)]) -> ApiKey:
    return _gateway(request).settings.keys.authenticate(key)


GatewayDep = Annotated[Gateway, Depends(_gateway)]
KeyDep = Annotated[ApiKey, Depends(_authenticated)]
IdemDep = Annotated[str | None, Header(alias=IDEMPOTENCY_HEADER, max_length=255)]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


def derive_request_id(key: ApiKey, idempotency_key: str, index: int | None = None) -> str:
    """Same (key, idempotency key) -> same request ID, and no other key can collide with it."""
    seed = f"{key.key_id}\0{idempotency_key}" + ("" if index is None else f"\0{index}")
    return "gw-" + hashlib.sha256(seed.encode()).hexdigest()[:40]


def _idempotency(value: str | None) -> str | None:
    if value is not None and not (0 < len(value) <= 255 and value.isprintable()):
        raise ValidationError("Idempotency-Key must be 1-255 printable characters")
    return value


async def _read(gw: Gateway, request: Request, key: ApiKey, model: str,
                batch: bool) -> Submission:
    key.check_model(model)
    try:
        check_model_name(model)
    except ValidationError:
        raise UnknownModelError(f"no such model {model!r}") from None
    raw = await read_limited(request.headers.get("content-length"), request.stream(),
                             gw.settings.max_body_bytes)
    doc = decode_body(raw, request.headers.get("content-type"))
    return parse_submission(doc, batch=batch, max_items=gw.settings.max_batch_items)


requests = APIRouter(prefix="/v1", tags=["requests"])
_SUBMIT_ERRORS = _errors(400, 401, 403, 404, 413, 415, 422, 503)


@requests.post("/models/{model}/requests", status_code=202, response_model=Accepted,
               responses=_SUBMIT_ERRORS, openapi_extra=body_schema(batch=False))
async def submit(model: str, request: Request, response: Response, gw: GatewayDep, key: KeyDep,
                 idempotency_key: IdemDep = None) -> Accepted:
    """Submit one request (JSON or msgpack). Answers 202 with the result's Location."""
    sub = await _read(gw, request, key, model, batch=False)
    idem = _idempotency(idempotency_key)
    rid = None if idem is None else derive_request_id(key, idem)
    if rid is not None and (await gw.existing([rid]))[0]:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        rid = await gw.client.submit(model, sub.inputs[0], request_id=rid,
                                     priority=sub.priority, deadline_s=sub.deadline_s,
                                     callback_url=sub.callback_url)
        gw.metrics.submitted.labels(model).inc()
    location = f"/v1/requests/{rid}"
    response.headers["Location"] = location
    return Accepted(request_id=rid, location=location)


@requests.post("/models/{model}/batches", status_code=202, response_model=BatchAccepted,
               responses=_SUBMIT_ERRORS, openapi_extra=body_schema(batch=True))
async def submit_batch(model: str, request: Request, gw: GatewayDep, key: KeyDep,
                       idempotency_key: IdemDep = None) -> BatchAccepted:
    """Submit many requests to one model; ``inputs`` holds one entry per request."""
    sub = await _read(gw, request, key, model, batch=True)
    idem = _idempotency(idempotency_key)
    options: dict[str, Any] = {"priority": sub.priority, "deadline_s": sub.deadline_s,
                               "callback_url": sub.callback_url}
    if idem is None:
        ids = await gw.client.submit_many(model, sub.inputs, **options)
    else:
        ids = [derive_request_id(key, idem, i) for i in range(len(sub.inputs))]
        todo = [i for i, there in enumerate(await gw.existing(ids)) if not there]
        if todo:
            await gw.client.submit_many(model, [sub.inputs[i] for i in todo],
                                        request_ids=[ids[i] for i in todo], **options)
    gw.metrics.submitted.labels(model).inc(len(ids))
    return BatchAccepted(request_ids=ids)


@requests.get("/requests/{request_id}", response_model=ResultOut,
              responses=_errors(401, 404, 422, 503))
async def get_result(
    request_id: str, response: Response, gw: GatewayDep, key: KeyDep,
    wait: Annotated[float, Query(ge=0, le=3600, description=(
        "Long-poll: hold the request up to this many seconds (capped by the gateway's "
        "--max-wait-s) until the result is terminal."))] = 0.0,
) -> dict[str, Any]:
    """The result, ``pending`` until terminal. ``?wait=S`` long-polls without spinning."""
    try:
        check_request_id(request_id)
    except ValidationError:
        raise RequestNotFoundError(f"no request {request_id!r}") from None
    result = await gw.client.get(request_id)
    # Another key's models are none of this key's business: "not found", not "forbidden".
    if result is None or (result.model and not key.allows(result.model)):
        raise RequestNotFoundError(f"no request {request_id!r} (unknown or expired)")
    if not result.is_terminal and wait > 0:
        with suppress(WaitTimeoutError):
            result = await gw.client.wait(request_id, min(wait, gw.settings.max_wait_s))
    if not result.is_terminal:
        response.headers["Retry-After"] = "1"
    return result_to_json(result)


operations = APIRouter(tags=["operations"])


@operations.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@operations.get("/readyz", response_model=Health, responses=_errors(503))
async def readyz(gw: GatewayDep) -> Health:
    """The result store answers, so submits and polls can work."""
    if not await gw.store.ping():
        raise ResultStoreError("result store unreachable")
    return Health(status="ready")


@operations.get("/metrics", response_class=Response)
async def prometheus(gw: GatewayDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)
