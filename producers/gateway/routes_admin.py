"""Operator routes: the fleet snapshot, the dead-letter queue and what each model version
answers, for admin keys only.

Each route calls the library the CLI calls and only shapes its answer:
``GET /v1/fleet`` is ``batchfleet status --json`` (the plane's ``fleet`` reader),
``GET /v1/dlq`` pages one model's dead letters and ``POST /v1/dlq/replay`` is
``batchfleet dlq replay [--dry-run]`` (``connectors.dlq_ops.DeadLetterOps``) and
``GET /v1/models/{model}/outputs`` is ``batchfleet models outputs --inputs --json``
(``connectors.output_report``). Any other
key gets 403. Every call opens its own connections: these are rare operator calls,
and keeping them off the request path's pool keeps them from competing with it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from batchfleet.connectors import open_broker
from batchfleet.connectors.dlq_ops import DeadLetterOps, Selection
from batchfleet.connectors.fleet_paused import fleet_document, paused_models
from batchfleet.connectors.output_report import read_rows
from batchfleet.connectors.values import DeadLetter
from batchfleet.producers.gateway.auth import ApiKey
from batchfleet.producers.gateway.models import (
    DeadLetterPage,
    ErrorResponse,
    FleetOut,
    OutputsOut,
    ReplayIn,
    ReplayOut,
)
from batchfleet.producers.gateway.routes import Gateway, GatewayDep, KeyDep
from batchfleet.schemas.errors import AuthError, ValidationError
from batchfleet.schemas.validation import check_model_name

admin = APIRouter(prefix="/v1", tags=["admin"])
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": ErrorResponse}
                                            for c in (401, 403, 422, 503)}
#: A stream entry ID, as ``next_cursor`` returns it.
_CURSOR = re.compile(r"\d{1,20}-\d{1,20}")


def _require_admin(key: ApiKey) -> None:
    if not key.admin:
        raise AuthError(f"API key {key.key_id!r} may not operate the fleet: that needs an "
                        "admin-scoped key (scopes=admin)", forbidden=True)


def _ops(gw: Gateway) -> DeadLetterOps:
    s = gw.settings
    return DeadLetterOps(s.broker, s.results, s.namespace)


def letter_json(dl: DeadLetter) -> dict[str, Any]:
    """One letter as ``batchfleet dlq list -o json`` prints it."""
    def iso(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).isoformat()

    errors = [{**e, "at": iso(e["at"])} if isinstance(e.get("at"), int | float) else e
              for e in dl.errors]
    return {"request_id": dl.request_id, "model": dl.model, "attempts": dl.attempts,
            "reason": dl.reason, "dead_at": iso(dl.dead_at) if dl.dead_at else None,
            "errors": errors}


@admin.get("/fleet", response_model=FleetOut, responses=_ERRORS)
async def fleet(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """Every model's lanes, the live workers and the totals: the document
    ``batchfleet status --json`` prints. Admin keys only."""
    _require_admin(key)
    s = gw.settings
    reader = gw.plane.fleet(open_broker(s.broker, namespace=s.namespace))
    try:
        snap = await reader.read()
        return fleet_document(snap, await paused_models(gw.plane.routes, snap))
    finally:
        await reader.close()


@admin.get("/dlq", response_model=DeadLetterPage, responses=_ERRORS)
async def dead_letters(
    gw: GatewayDep, key: KeyDep,
    model: Annotated[str, Query(description="The model whose dead letters to list.")],
    cursor: Annotated[str | None, Query(description="``next_cursor`` of the previous page."
                                        )] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Letters per page.")] = 100,
) -> dict[str, Any]:
    """One page of a model's dead letters, oldest first; follow ``next_cursor`` for the
    rest (one bounded read per page, whatever the queue's length). Admin keys only."""
    _require_admin(key)
    check_model_name(model)
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise ValidationError(f"cursor {cursor!r} is not a next_cursor this API returned")
    ops = _ops(gw)
    try:
        letters: list[DeadLetter] = []
        async for page in ops.queue.pages(model, page=limit, after=cursor or ""):
            letters = page
            break
    finally:
        await ops.close()
    return {"model": model, "letters": [letter_json(dl) for dl in letters],
            "next_cursor": letters[-1].entry_id if len(letters) == limit else None}


@admin.post("/dlq/replay", response_model=ReplayOut, responses=_ERRORS)
async def replay(body: ReplayIn, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """Re-run dead-lettered requests under their own IDs (``batchfleet dlq replay``): the
    listed ``request_ids``, or every letter of ``model``. A request whose result is no
    longer ``failed`` is skipped. ``dry_run`` says what would happen and changes nothing.
    Admin keys only."""
    _require_admin(key)
    if not body.request_ids and not body.model:
        raise ValidationError("name the dead letters to replay: request_ids or model")
    if body.model is not None:
        check_model_name(body.model)
    selection = Selection(model=body.model, request_ids=tuple(body.request_ids))
    ops = _ops(gw)
    try:
        report = await (ops.replay_plan(selection) if body.dry_run
                        else ops.replay_selected(selection))
    finally:
        await ops.close()
    return {"dry_run": body.dry_run, "replayed": report.replayed, "skipped": report.skipped}


@admin.get("/models/{model}/outputs", response_model=OutputsOut, responses=_ERRORS)
async def outputs(
    model: str, gw: GatewayDep, key: KeyDep,
    since_s: Annotated[float, Query(ge=1.0, le=30 * 24 * 3600.0,
                                    description="The period, ending now.")] = 900.0,
) -> dict[str, Any]:
    """Each version's output and input statistics and drift against its reference:
    ``batchfleet models outputs MODEL --inputs --json`` (docs/monitoring.md). Admin keys
    only."""
    _require_admin(key)
    check_model_name(model)
    rows = await read_rows(gw.plane, model, since_s)
    return {"model": model, "since_s": since_s,
            "versions": [r.to_json(inputs=True) for r in rows]}
