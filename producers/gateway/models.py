"""Response models and request-body schemas: what the published OpenAPI spec shows."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from batchfleet.schemas.tensors import DTYPES


class ErrorDetail(BaseModel):
    type: str = Field(description="Stable error type, e.g. validation_error, unknown_model.")
    message: str
    retryable: bool


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Accepted(BaseModel):
    request_id: str
    status: str = "pending"
    location: str = Field(description="Poll or long-poll the result here.")


class BatchAccepted(BaseModel):
    request_ids: list[str]
    status: str = "pending"


class ResultOut(BaseModel):
    request_id: str
    status: str = Field(description="pending, succeeded, failed, expired or cancelled")
    outputs: Any = Field(None, description="Nested arrays (or named ones) when succeeded.")
    error: ErrorDetail | None = None
    model: str
    model_version: str
    attempts: int
    enqueued_at: float
    started_at: float | None
    finished_at: float | None
    queue_ms: float | None
    compute_ms: float | None
    batch_size: int | None
    generation: int
    cached: bool = Field(False, description=(
        "Answered from the result cache: computed earlier for the same owner's identical "
        "inputs (docs/cache.md); compute_ms is then 0 and batch_size null."))
    degraded: bool = Field(False, description=(
        "Answered by the model's fallback chain, not by the model (docs/degradation.md)."))
    degraded_reason: str | None = Field(None, description=(
        "Why it was degraded: error, breaker, deadline or overload."))
    fallback: str | None = Field(None, description=(
        "The step that answered: cache, model:NAME@VERSION, rules:module:function or value."))
    degraded_error: ErrorDetail | None = Field(None, description=(
        "The failure that caused the degradation (error stays null on a success)."))
    steps: list[dict[str, Any]] | None = Field(None, description=(
        "A pipeline's result only: per step its model, model_version, status, queue_ms, "
        "compute_ms, attempts, and degraded/fallback when a fallback answered it "
        "(docs/pipelines.md)."))


class Health(BaseModel):
    status: str


class Readiness(Health):
    eviction_policy: str | None = Field(default=None,
                                        description="Redis maxmemory-policy (readyz).")
    eviction_policy_safe: bool | None = Field(
        default=None, description="False when Redis may evict a queue (allkeys-*): fix Redis.")


_COMMON: dict[str, Any] = {
    "dtype": {"type": "string", "enum": sorted(DTYPES),
              "description": "Element type; default float32 for decimals, int64 for integers."},
    "priority": {"type": "string", "enum": ["interactive", "high", "bulk", "low"],
                 "default": "interactive"},
    "deadline_s": {"type": ["number", "null"], "exclusiveMinimum": 0,
                   "description": "Answer `expired` instead of computing after this long."},
    "callback_url": {"type": ["string", "null"], "maxLength": 2048,
                     "description": "Webhook for the terminal result (see docs/webhooks.md)."},
    "version": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                "description": "Pin to one version label (docs/rollout.md, Routing)."},
    "routing_key": {"type": ["string", "null"], "minLength": 1, "maxLength": 256,
                    "description": "Hashed instead of the request ID to pick a version."},
    "degrade": {"type": ["string", "null"], "enum": ["allow", "never", None],
                "default": "allow",
                "description": "never: fail closed (`unavailable`) where the model's fallback "
                               "chain would answer (docs/degradation.md)."},
    "cache": {"type": ["boolean", "null"], "default": True,
              "description": "false: never answered from the result cache, nor stored in it "
                             "(docs/cache.md)."},
}
_TENSOR = {"description": "A number, a nested array of numbers, an object of named arrays, "
                          "or (msgpack) a wire tensor map {dtype, shape, data}."}


def body_schema(batch: bool) -> dict[str, Any]:
    inputs = ({"type": "array", "minItems": 1, "items": _TENSOR,
               "description": "One entry per request."} if batch else _TENSOR)
    schema = {"type": "object", "required": ["inputs"], "additionalProperties": False,
              "properties": {"inputs": inputs, **_COMMON}}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema},
        "application/msgpack": {"schema": schema},
    }}}


# --- model discovery and rollout (routes_models.py) -------------------------------------


class TensorSpecOut(BaseModel):
    dtype: str = Field(description="e.g. float32")
    shape: list[int] = Field(description="Per request, no batch dimension.")


class VersionOut(BaseModel):
    label: str = Field(description="The @VERSION label (`default` when unlabelled).")
    version: str = Field(description="Content hash results carry in model_version.")
    input: TensorSpecOut | None
    output: TensorSpecOut | None


class Guard(BaseModel):
    error_points: float = Field(5.0, gt=0, le=100, description=(
        "Roll back when the canary's error rate exceeds stable's by this many points."))
    p99_ratio: float = Field(2.0, gt=1, le=1e6, description=(
        "Roll back when the canary's p99 compute exceeds stable's this many times."))
    min_window: int = Field(200, ge=1, le=10**9,
                            description="Judge the canary only after this many requests.")
    # The optional checks (docs/rollout.md, "How the guard decides"): left out of a PUT,
    # each keeps its value; 0 or null turns it off; off, it reads null.
    psi: float | None = Field(None, ge=0, le=1e6, description=(
        "Roll back when the canary's output PSI against stable's exceeds this."))
    nan_points: float | None = Field(None, ge=0, le=100, description=(
        "Roll back when the canary's NaN rate exceeds stable's by this many points."))
    agreement: float | None = Field(None, ge=0, le=1, description=(
        "Refuse a canary or promotion whose recorded shadow arg-max agreement with "
        "stable is below this share (unless forced)."))


class PolicyOut(BaseModel):
    stable: str
    canary: str | None
    percent: float = Field(description="The canary's share of requests, 0-100.")
    shadow: str | None
    previous: str | None = Field(description="The stable a promotion replaced.")
    epoch: int = Field(description="Rises by one with every change.")
    guard: Guard


class ServingOut(BaseModel):
    worker: str
    labels: list[str] = Field(description="The version labels this worker holds.")
    last_seen: float


class ModelOut(BaseModel):
    name: str
    declared: bool = Field(description="An operator declared it (`models declare`).")
    input: TensorSpecOut | None = Field(description="Declared, else the stable version's.")
    output: TensorSpecOut | None
    versions: list[VersionOut]
    policy: PolicyOut
    workers: list[ServingOut] = Field(description="Live workers serving it.")


class ModelList(BaseModel):
    models: list[ModelOut]


class PolicyIn(BaseModel):
    stable: str = Field(max_length=64)
    canary: str | None = Field(None, max_length=64)
    percent: float = Field(0.0, ge=0, le=100)
    shadow: str | None = Field(None, max_length=64)
    guard: Guard | None = Field(None, description="Kept as it is when left out.")
    why: str = Field("", max_length=1000, description="Kept in the policy history.")
    force: bool = Field(False, description=(
        "Go ahead though the new canary's recorded shadow agreement is below the guard's "
        "`agreement`."))


class ChangeIn(BaseModel):
    why: str = Field("", max_length=1000, description="Kept in the policy history.")


class PromoteIn(ChangeIn):
    force: bool = Field(False, description=(
        "Go ahead though the canary's recorded shadow agreement is below the guard's "
        "`agreement`."))


class PolicyChangeOut(BaseModel):
    at: float
    who: str
    why: str
    action: str = Field(description="set, promote or rollback")
    policy: PolicyOut


class RoleStatsOut(BaseModel):
    requests: int
    errors: int
    error_rate: float
    p50_compute_ms: float | None
    p99_compute_ms: float | None


class VersionStatsOut(BaseModel):
    label: str
    epoch: int | None
    roles: dict[str, RoleStatsOut] = Field(description="By role: stable, canary, shadow, …")


class VersionRolloutOut(BaseModel):
    role: str | None = Field(description="stable, canary, shadow, or null (idle).")
    version: str | None
    workers: list[str]
    stats: VersionStatsOut | None


class WorkerEpochOut(BaseModel):
    labels: list[str]
    epoch: int | None = Field(description="The policy epoch its heartbeat reports.")


class RolloutOut(BaseModel):
    model: str
    policy: PolicyOut
    versions: dict[str, VersionRolloutOut]
    workers: dict[str, WorkerEpochOut] = Field(description="Live workers serving the model.")
    converged: bool = Field(description="Every live worker reports the policy's epoch.")
    stats_available: bool = Field(description="False until workers publish per-version stats.")
    history: list[PolicyChangeOut] = Field(description="Newest first.")


class FleetOut(BaseModel):
    """``batchfleet status --json``: the same document, from the same reader."""

    taken_at: float
    namespace: str
    broker: str
    lanes: list[dict[str, Any]] = Field(description="One per model and lane.")
    workers: list[dict[str, Any]] = Field(description="Live workers (fresh heartbeat).")
    totals: dict[str, Any]
    paused: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "Models an operator paused (`models pause`, the console): {at, who, why}."))


class OutputSideOut(BaseModel):
    """One side (outputs or inputs) of a version, as ``models outputs --json`` prints it."""

    reference: str | None = Field(description="baseline, stable, or null (no drift).")
    count: int = Field(description="Values counted (docs/monitoring.md).")
    nan_rate: float | None
    mean: float | None
    p50: float | None
    p99: float | None
    psi: float | None = Field(description="Null below 2,000 values on either side.")
    ks: float | None


class VersionOutputsOut(OutputSideOut):
    """One version's row of ``batchfleet models outputs MODEL --inputs --json``."""

    version: str
    role: str = Field(description="stable, canary, shadow or pinned.")
    inputs: OutputSideOut


class OutputsOut(BaseModel):
    model: str
    since_s: float
    versions: list[VersionOutputsOut]


class DeadLetterOut(BaseModel):
    """As ``batchfleet dlq list -o json`` prints it."""

    request_id: str
    model: str
    attempts: int
    reason: str
    dead_at: str | None = Field(description="ISO 8601, UTC.")
    errors: list[dict[str, Any]] = Field(description="One per attempt, oldest first.")


class DeadLetterPage(BaseModel):
    model: str
    letters: list[DeadLetterOut] = Field(description="Oldest first.")
    next_cursor: str | None = Field(
        description="Pass as ``cursor`` for the next page; null on the last page.")


class ReplayIn(BaseModel):
    request_ids: list[str] = Field(default_factory=list, max_length=10_000,
                                   description="Replay these requests' dead letters.")
    model: str | None = Field(default=None, description="Replay every letter of this model.")
    dry_run: bool = Field(default=False,
                          description="Only say what would be replayed; change nothing.")


class ReplayOut(BaseModel):
    dry_run: bool
    replayed: list[str] = Field(description="Re-run under their own IDs (or would be).")
    skipped: dict[str, str] = Field(description="Request ID -> why it was not replayed.")
