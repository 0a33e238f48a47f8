"""Model discovery and rollout routes.

``GET /v1/models`` and ``GET /v1/models/{model}`` list what the fleet serves, from the
model registry record; a key sees only the models its allowlist permits, and any other
model does not exist for it (404). The rollout routes change a model's policy through
``connectors.rollout`` (the code the CLI runs) and need an admin-scoped key: another
key that may use the model gets 403. Changes are recorded as made by ``api-key:{id}``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Body

from batchfleet.connectors.control_plane import Rollouts
from batchfleet.producers.gateway.auth import ApiKey
from batchfleet.producers.gateway.models import (
    ChangeIn,
    ErrorResponse,
    Guard,
    ModelList,
    ModelOut,
    PolicyIn,
    PolicyOut,
    PromoteIn,
    RolloutOut,
)
from batchfleet.producers.gateway.routes import Gateway, GatewayDep, KeyDep
from batchfleet.schemas.errors import AuthError, UnknownModelError, ValidationError
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.schemas.validation import check_model_name

models = APIRouter(prefix="/v1", tags=["models"])
_READ_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (401, 403, 404, 422, 503)}


def _visible(key: ApiKey, model: str) -> str:
    """The model, if this key may know of it; else it does not exist (404)."""
    try:
        check_model_name(model)
    except ValidationError:
        raise UnknownModelError(f"no such model {model!r}") from None
    if not key.allows(model):
        raise UnknownModelError(f"no such model {model!r}")
    return model


def _admin(key: ApiKey, model: str) -> str:
    _visible(key, model)
    if not key.admin:
        raise AuthError(f"API key {key.key_id!r} may not change rollouts: that needs an "
                        "admin-scoped key (scopes=admin)", forbidden=True)
    return model


def _who(key: ApiKey) -> str:
    return f"api-key:{key.key_id}"


def _rollouts(gw: Gateway) -> Rollouts:
    return gw.plane.rollouts


@models.get("/models", response_model=ModelList, responses=_READ_ERRORS)
async def list_models(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """Every model this key may use that the fleet serves or has declared: versions, input
    and output specs, the rollout policy and the live workers serving it."""
    records = await _rollouts(gw).registry.records()
    now = time.time()
    return {"models": [r.summary(now) for r in records if key.allows(r.name)]}


@models.get("/models/{model}", response_model=ModelOut, responses=_READ_ERRORS)
async def get_model(model: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """One model's entry, as in ``GET /v1/models``."""
    record = await _rollouts(gw).registry.get(_visible(key, model))
    if record is None:
        raise UnknownModelError(f"no such model {model!r}")
    return record.summary(time.time())


@models.get("/models/{model}/rollout", response_model=RolloutOut, responses=_READ_ERRORS)
async def get_rollout(model: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """The policy, its history (who, when, why) and per-version stats. Admin keys only."""
    return (await _rollouts(gw).status(_admin(key, model))).to_json()


@models.put("/models/{model}/rollout", response_model=PolicyOut, responses=_READ_ERRORS)
async def put_rollout(model: str, body: PolicyIn, gw: GatewayDep, key: KeyDep
                      ) -> dict[str, Any]:
    """Replace the policy (bumps its epoch). The versions must be registered once workers
    registered any; 422 says what is wrong, and nothing changes then. Admin keys only."""
    name = _admin(key, model)
    guard = None
    if body.guard is not None:
        record = await _rollouts(gw).registry.get(name)
        guard = guard_from(body.guard,
                           record.policy.guard if record is not None else GuardThresholds())
    done = await _rollouts(gw).set(name, stable=body.stable, canary=body.canary,
                                   percent=body.percent, shadow=body.shadow, guard=guard,
                                   who=_who(key), why=body.why, force=body.force)
    return done.to_wire()


ChangeBody = Annotated[ChangeIn | None, Body()]


@models.post("/models/{model}/rollout/promote", response_model=PolicyOut,
             responses=_READ_ERRORS)
async def promote(model: str, gw: GatewayDep, key: KeyDep,
                  body: Annotated[PromoteIn | None, Body()] = None) -> dict[str, Any]:
    """The canary becomes stable (422 when there is none, or when its recorded shadow
    agreement is below the guard's ``agreement`` without ``force``). Admin keys only."""
    done: RolloutPolicy = await _rollouts(gw).promote(
        _admin(key, model), who=_who(key), why=body.why if body else "",
        force=body.force if body else False)
    return done.to_wire()


@models.post("/models/{model}/rollout/rollback", response_model=PolicyOut,
             responses=_READ_ERRORS)
async def rollback(model: str, gw: GatewayDep, key: KeyDep, body: ChangeBody = None
                   ) -> dict[str, Any]:
    """Canary and shadow off; with neither, back to the previous stable (422 when there
    is nothing to roll back). Admin keys only."""
    done = await _rollouts(gw).rollback(_admin(key, model), who=_who(key),
                                        why=body.why if body else "")
    return done.to_wire()


def guard_from(given: Guard, old: GuardThresholds) -> GuardThresholds:
    """The thresholds a PUT's ``guard`` sets (pure): each key it names, as given (0 or
    null turns ``psi``, ``nan_points`` or ``agreement`` off); each it leaves out kept from
    ``old``, as ``rollout set`` keeps a flag left out."""
    named = given.model_fields_set
    changes: dict[str, Any] = {k: getattr(given, k) for k in named}
    for key in ("psi", "nan_points", "agreement"):
        if key in named:
            changes[key] = changes[key] or None
    return replace(old, **changes)
