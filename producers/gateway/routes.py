"""The gateway's routes. Auth runs first (a dependency), so a refused request never
touches Redis. Every record is owned by the key that submitted it: reads answer 404
for another key's request, exactly as for one that does not exist (an admin-scoped key
reads them all). Idempotency comes from the result store: with an ``Idempotency-Key``
the request ID is an HMAC, under the gateway's secret, of (API key id, idempotency
key), and an ID that already has a record is answered with that ID and not submitted
again, or refused (409) when the model or body differ. Quotas are charged only for
what is enqueued (connectors/quotas.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from batchfleet.connectors.control_plane import ControlPlane, Quotas, StoreResults
from batchfleet.connectors.quotas import OVER_IN_FLIGHT, OVER_RATE
from batchfleet.connectors.values import StoredRecord
from batchfleet.producers.client import AsyncClient, new_request_id
from batchfleet.producers.gateway.auth import ApiKey
from batchfleet.producers.gateway.bodies import (
    Submission,
    decode_body,
    parse_submission,
    read_limited,
)
from batchfleet.producers.gateway.metrics import GatewayMetrics
from batchfleet.producers.gateway.models import (
    Accepted,
    BatchAccepted,
    ErrorResponse,
    Health,
    Readiness,
    ResultOut,
    body_schema,
)
from batchfleet.producers.gateway.settings import GatewaySettings
from batchfleet.producers.gateway.tenancy import (
    derive_request_id,
    fingerprint,
    not_found,
    readable_body,
    refusal,
    replays,
)
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.errors import (
    RequestNotFoundError,
    ResultStoreError,
    UnknownModelError,
    ValidationError,
    WaitTimeoutError,
)
from batchfleet.schemas.json_form import result_json_bytes, result_to_json
from batchfleet.schemas.names import check_model_name, check_request_id
from batchfleet.schemas.registry import UnregisteredModelError
from batchfleet.schemas.result_decode import decode_result

API_KEY_HEADER = "X-API-Key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
_LIMITS = {OVER_RATE: "rate", OVER_IN_FLIGHT: "in_flight"}


@dataclass(frozen=True, slots=True)
class Gateway:
    """What the routes share, created in the app's lifespan."""

    settings: GatewaySettings
    client: AsyncClient
    #: Its own, apart from the client's: readiness, ownership reads, quotas, rollouts.
    plane: ControlPlane
    metrics: GatewayMetrics
    #: HMAC key for derived request IDs (settings.id_secret, or random per process).
    id_secret: bytes

    @property
    def store(self) -> StoreResults:
        return self.plane.results

    @property
    def quotas(self) -> Quotas:
        return self.plane.quotas

    async def admit(self, key: ApiKey, ids: Sequence[str], response: Response) -> None:
        """Charge ``ids`` to the key's quota (slots held until their terminal results, even
        past a deadline: connectors/quotas.py), or raise 429 with nothing enqueued."""
        quota = key.quota
        if not quota.limited or not ids:
            return
        verdict = await self.quotas.admit(key.key_id, quota, ids)
        if verdict.allowed:
            response.headers.update(verdict.headers(quota))
            return
        if verdict.code in _LIMITS:
            self.metrics.throttled.labels(key.key_id, _LIMITS[verdict.code]).inc(len(ids))
        raise refusal(key, verdict, len(ids))

    async def enqueue(self, key: ApiKey, model: str, sub: Submission, ids: list[str],
                      inputs: list[Any], fingerprint: str, response: Response) -> None:
        """Admit, then submit owned by ``key``; a failed submit gives its slots back.
        ``fingerprint`` is "" for IDs the gateway made (see :meth:`AsyncClient.submit`)."""
        await self.admit(key, ids, response)
        options: dict[str, Any] = {
            "priority": sub.priority, "deadline_s": sub.deadline_s,
            "callback_url": sub.callback_url, "owner": key.key_id, "fingerprint": fingerprint,
            "version": sub.version, "routing_key": sub.routing_key, "cache": sub.cache,
            "degrade": sub.degrade}
        try:
            if len(ids) == 1:  # coalesced with concurrent single submits: fewer round trips
                await self.client.submit(model, inputs[0], request_id=ids[0], **options)
            else:
                await self.client.submit_many(model, inputs, request_ids=ids, **options)
        except BaseException:
            if key.quota.max_in_flight:
                await self.quotas.release(key.key_id, ids)
            raise
        self.metrics.submitted.labels(model).inc(len(ids))
        self.metrics.accepted.labels(key.key_id).inc(len(ids))

    async def replayed(self, key: ApiKey, ids: Sequence[str], fp: str) -> list[str | None]:
        """Per ID, the current status of its record if it has one (a replay), else None."""
        records = await self.store.get_records(ids)
        there = replays(key, records, fp)  # 409 first if one was made from another body
        return [r.status if was and r is not None else None
                for r, was in zip(records, there, strict=True)]


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


def _idempotency(value: str | None) -> str | None:
    if value is not None and not (0 < len(value) <= 255 and value.isprintable()):
        raise ValidationError("Idempotency-Key must be 1-255 printable characters")
    return value


async def _read(gw: Gateway, request: Request, key: ApiKey, model: str,
                batch: bool) -> tuple[Submission, str]:
    """The submission and its fingerprint."""
    key.check_model(model)
    try:
        check_model_name(model)
    except ValidationError:
        raise UnknownModelError(f"no such model {model!r}") from None
    try:  # before the body is read: served or declared (cached), else 404 saying how to declare
        await gw.client.ensure_model(model)
    except UnregisteredModelError as exc:
        raise UnknownModelError(exc.advice("http")) from None
    raw = await read_limited(request.headers.get("content-length"), request.stream(),
                             gw.settings.max_body_bytes)
    content_type = request.headers.get("content-type")
    doc = decode_body(raw, content_type)
    sub = parse_submission(doc, batch=batch, max_items=gw.settings.max_batch_items)
    return sub, fingerprint(model, content_type, raw)


requests = APIRouter(prefix="/v1", tags=["requests"])
_SUBMIT_ERRORS = _errors(400, 401, 403, 404, 409, 413, 415, 422, 429, 503)


@requests.post("/models/{model}/requests", status_code=202, response_model=Accepted,
               responses=_SUBMIT_ERRORS, openapi_extra=body_schema(batch=False))
async def submit(model: str, request: Request, response: Response, gw: GatewayDep, key: KeyDep,
                 idempotency_key: IdemDep = None) -> Accepted:
    """Submit one request (JSON or msgpack). Answers 202 with the result's Location."""
    sub, fp = await _read(gw, request, key, model, batch=False)
    idem = _idempotency(idempotency_key)
    if idem is None:
        rid = new_request_id()  # made here: nothing to fingerprint ("")
        await gw.enqueue(key, model, sub, [rid], sub.inputs, "", response)
    else:
        rid = derive_request_id(gw.id_secret, key, idem)
        status = (await gw.replayed(key, [rid], fp))[0]
        if status is not None:  # answered with where it is now, which may be finished
            response.headers["Idempotent-Replayed"] = "true"
            location = f"/v1/requests/{rid}"
            response.headers["Location"] = location
            return Accepted(request_id=rid, status=status, location=location)
        await gw.enqueue(key, model, sub, [rid], sub.inputs, fp, response)
    location = f"/v1/requests/{rid}"
    response.headers["Location"] = location
    return Accepted(request_id=rid, location=location)


@requests.post("/models/{model}/batches", status_code=202, response_model=BatchAccepted,
               responses=_SUBMIT_ERRORS, openapi_extra=body_schema(batch=True))
async def submit_batch(model: str, request: Request, response: Response, gw: GatewayDep,
                       key: KeyDep, idempotency_key: IdemDep = None) -> BatchAccepted:
    """Submit many requests to one model; ``inputs`` holds one entry per request."""
    sub, fp = await _read(gw, request, key, model, batch=True)
    idem = _idempotency(idempotency_key)
    if idem is None:
        ids = [new_request_id() for _ in sub.inputs]
        await gw.enqueue(key, model, sub, ids, sub.inputs, "", response)
    else:
        ids = [derive_request_id(gw.id_secret, key, idem, i) for i in range(len(sub.inputs))]
        todo = [i for i, there in enumerate(await gw.replayed(key, ids, fp)) if there is None]
        if todo:
            await gw.enqueue(key, model, sub, [ids[i] for i in todo],
                             [sub.inputs[i] for i in todo], fp, response)
    return BatchAccepted(request_ids=ids)


@requests.get("/requests/{request_id}", response_model=ResultOut,
              responses=_errors(401, 404, 410, 422, 503))
async def get_result(
    request_id: str, gw: GatewayDep, key: KeyDep,
    wait: Annotated[float, Query(ge=0, le=3600, description=(
        "Long-poll: hold the request up to this many seconds (capped by the gateway's "
        "--max-wait-s) until the result is terminal."))] = 0.0,
) -> Response:
    """The result, ``pending`` until terminal. ``?wait=S`` long-polls without spinning.

    Only the key that submitted a request (or an admin-scoped key) can read it; for any
    other key it does not exist (404)."""
    try:
        check_request_id(request_id)
    except ValidationError:
        raise not_found(request_id) from None
    body = readable_body(key, request_id, (await gw.store.get_records([request_id], True))[0])
    result = decode_result(body)
    # Models the key may no longer use are none of its business either.
    if result.model and not key.allows(result.model):
        raise not_found(request_id)
    if not result.is_terminal and wait > 0:
        with suppress(WaitTimeoutError):
            result = await gw.client.wait(request_id, min(wait, gw.settings.max_wait_s))
    # The same bytes a webhook sends (schemas.json_form), not a re-serialization of them.
    out = Response(result_json_bytes(result), media_type="application/json")
    if not result.is_terminal:
        out.headers["Retry-After"] = "1"
    return out


#: Most IDs one ``GET /v1/requests?ids=`` reads.
MAX_IDS = 100


class ResultsOut(BaseModel):
    results: list[ResultOut] = Field(description="The readable results, in the order asked.")
    not_found: list[str] = Field(description=(
        "IDs unknown, expired or another key's: one answer for all three, as for one ID."))


class CancelOut(BaseModel):
    request_id: str
    outcome: str = Field(description=(
        "cancelled (never computed), already_running (a worker holds it; it finishes) or "
        "already_finished"))
    status: str | None = Field(description="Its stored status now.")


def _owned(key: ApiKey, request_id: str, record: StoredRecord | None) -> Result | None:
    """The record's result if ``key`` may see it; None exactly as for a missing one."""
    try:
        check_request_id(request_id)
        result = decode_result(readable_body(key, request_id, record))
    except (ValidationError, RequestNotFoundError):
        return None
    return None if result.model and not key.allows(result.model) else result


def _is_request_id(value: str) -> bool:
    try:
        check_request_id(value)
    except ValidationError:
        return False
    return True


@requests.get("/requests", response_model=ResultsOut, responses=_errors(401, 422, 503))
async def get_results(
    gw: GatewayDep, key: KeyDep,
    ids: Annotated[str, Query(min_length=1, description=(
        f"Comma-separated request IDs, at most {MAX_IDS}."))],
) -> Response:
    """Many results in one read (no long-poll). Each follows the ownership rules of
    ``GET /v1/requests/{id}``: another key's ID is listed in ``not_found`` like a missing one."""
    wanted = list(dict.fromkeys(rid for rid in ids.split(",") if rid))
    if not 0 < len(wanted) <= MAX_IDS:
        raise ValidationError(f"ids takes 1 to {MAX_IDS} request IDs, got {len(wanted)}")
    valid = [rid for rid in wanted if _is_request_id(rid)]  # others never touch the store
    records = dict(zip(valid, await gw.store.get_records(valid, True), strict=True))
    found = {rid: _owned(key, rid, records.get(rid)) for rid in wanted}
    body = {"results": [result_to_json(r) for r in found.values() if r is not None],
            "not_found": [rid for rid, r in found.items() if r is None]}
    return Response(json.dumps(body, separators=(",", ":"), allow_nan=False).encode(),
                    media_type="application/json")


@requests.delete("/requests/{request_id}", response_model=CancelOut,
                 responses=_errors(401, 404, 503))
async def cancel_request(request_id: str, gw: GatewayDep, key: KeyDep) -> CancelOut:
    """Cancel a queued request: it gets the terminal status ``cancelled`` and is never
    computed. One a worker already holds finishes (``already_running``). Another key's
    request is a 404, as for reads."""
    if _owned(key, request_id, (await gw.store.get_records([request_id], True))[0]) is None:
        raise not_found(request_id)
    report = await gw.client.cancel(request_id)
    if report.outcome == "unknown":  # expired in between
        raise not_found(request_id)
    return CancelOut(request_id=request_id, outcome=report.outcome, status=report.status)


operations = APIRouter(tags=["operations"])


@operations.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@operations.get("/readyz", response_model=Readiness, responses=_errors(503))
async def readyz(gw: GatewayDep) -> Readiness:
    """The result store answers, so submits and polls can work. Also reports Redis's
    eviction policy: ``eviction_policy_safe`` is false when it may evict queued requests."""
    if not await gw.store.ping():
        raise ResultStoreError("result store unreachable")
    pressure = await gw.store.pressure()
    return Readiness(status="ready", eviction_policy=pressure.eviction_policy,
                     eviction_policy_safe=pressure.eviction_safe)


@operations.get("/metrics", response_class=Response)
async def prometheus(gw: GatewayDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)
