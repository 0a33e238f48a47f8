"""The model registry record: one documented record per model, and its codec.

A model is known to the fleet when an operator declared it (``batchfleet models
declare``), when a worker serves it, or both. Its record says which versions
exist (with their input and output specs), who declared it, which workers
serve it and when each was last seen, the rollout policy and the lane shards.
Later work (rollout, scale-out, operations) extends this record rather than
adding keys of its own.

The Redis layout (docs/wire-format.md, "Model registry") is one hash per model,
``{ns}:model:{name}``, plus the index set ``{ns}:models`` of every name that has
a record, so listing is one round trip. Structured values are msgpack maps:

* ``version:{label}`` -> ``{version, input, output}`` (``label`` is ``default``
  when unlabelled; ``input``/``output`` are ``{dtype, shape}`` or nil);
* ``declared`` -> ``{at, input, output}``, present while an operator declares it;
* ``served:{worker_id}`` -> ``{at, labels[, loaded]}``, rewritten by that worker every beat;
* ``policy`` -> ``{stable, canary, percent, shadow, previous, epoch, guard}``
  (``canary``/``shadow``/``previous`` nil when off; ``guard`` is
  ``{error_points, p99_ratio, min_window}``), rewritten whole by one script that
  bumps ``epoch`` (``connectors.model_registry``);
* ``lane_shards`` -> a decimal integer: how many streams each of the model's lanes is
  split into (``--lane-shards``), rewritten by its workers every beat; producers
  publish to shard ``crc32(request_id) % lane_shards`` (``schemas.names.shard_for``);
* ``lane_shards_max`` -> a decimal integer, the high-water mark of ``lane_shards``
  (only ever raised): workers consume shards ``0..lane_shards_max-1``, so lowering K
  strands nothing in the shards no longer published to.

Beside the hash, ``{ns}:model:{name}:history`` is a capped list (newest first) of
policy changes, each ``{at, who, why, action, policy}``.

This module only encodes and decodes; ``connectors.model_registry`` reads and
writes Redis. It imports nothing from the project but errors and the tensor spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgpack

from batchfleet.schemas.errors import UnknownModelError, ValidationError
from batchfleet.schemas.tensor_spec import TensorSpec  # also importable from here

DEFAULT_LABEL: Final = "default"
#: A served entry older than this is a worker gone without saying so (killed, partitioned):
#: three heartbeat TTLs, so a worker briefly cut off from Redis is not dropped.
SERVED_WITHIN_S: Final = 30.0

F_DECLARED: Final = "declared"
F_POLICY: Final = "policy"
F_LANE_SHARDS: Final = "lane_shards"
F_LANE_SHARDS_MAX: Final = "lane_shards_max"
#: An operator's pause of the model's lanes (``{at, who, why}``); absent: not paused.
F_PAUSED: Final = "paused"
VERSION_PREFIX: Final = "version:"
SERVED_PREFIX: Final = "served:"

_LABEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)


@dataclass(frozen=True, slots=True)
class ModelVersion:
    """One served version: its label, content hash (what results carry) and specs."""

    label: str
    version: str
    input: TensorSpec | None = None
    output: TensorSpec | None = None
    #: Where it comes from: a repository version folder's URL (optional key ``source``);
    #: "" for ``--model`` (and from older workers).
    source: str = ""

    def to_wire(self) -> dict[str, Any]:
        wire = {"version": self.version, "input": _spec_wire(self.input),
                "output": _spec_wire(self.output)}
        return {**wire, "source": self.source} if self.source else wire


@dataclass(frozen=True, slots=True)
class Declaration:
    """An operator's promise that the model will be served, made before any worker exists."""

    at: float
    input: TensorSpec | None = None
    output: TensorSpec | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"at": self.at, "input": _spec_wire(self.input), "output": _spec_wire(self.output)}


@dataclass(frozen=True, slots=True)
class Serving:
    """One worker serving the model: last seen at ``at`` (its latest heartbeat)."""

    worker_id: str
    at: float
    labels: tuple[str, ...] = (DEFAULT_LABEL,)
    #: Whether it holds the model in memory now, where it loads models on demand
    #: (optional key ``loaded``); None: it holds every model it serves.
    loaded: bool | None = None

    def live(self, now: float, within_s: float = SERVED_WITHIN_S) -> bool:
        return now - self.at <= within_s


@dataclass(frozen=True, slots=True)
class GuardThresholds:
    """When the automatic rollback guard reverts a canary, each only on significant
    evidence (docs/rollout.md, "How the guard decides"): its error rate above stable's by
    more than ``error_points`` percentage points, or its p99 compute above ``p99_ratio``
    times stable's, judged once the canary has at least ``min_window`` requests. The
    output checks are off unless set: ``psi`` (its outputs' PSI against stable's above
    this) and ``nan_points`` (its NaN rate above stable's by more than this many points).
    ``agreement`` (0-1) is no rollback: a version whose recorded shadow arg-max agreement
    with stable is below it is refused as canary or promotion unless forced. The three
    optional keys are written only when set, so older readers and records are unchanged."""

    error_points: float = 5.0
    p99_ratio: float = 2.0
    min_window: int = 200
    psi: float | None = None
    nan_points: float | None = None
    agreement: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.error_points <= 100.0:
            raise ValidationError(
                f"guard error delta {self.error_points} must be in (0, 100] points")
        if not self.p99_ratio > 1.0:
            raise ValidationError(f"guard p99 ratio {self.p99_ratio} must be above 1")
        if self.min_window < 1:
            raise ValidationError(f"guard window {self.min_window} must be at least 1 request")
        if self.psi is not None and not self.psi > 0.0:
            raise ValidationError(f"guard PSI {self.psi} must be above 0 (0 turns it off)")
        if self.nan_points is not None and not 0.0 < self.nan_points <= 100.0:
            raise ValidationError(
                f"guard NaN delta {self.nan_points} must be in (0, 100] points (0 turns it off)")
        if self.agreement is not None and not 0.0 < self.agreement <= 1.0:
            raise ValidationError(f"guard agreement {self.agreement} must be in (0, 1] "
                                  "(a share of requests; 0 turns it off)")

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"error_points": self.error_points,
                                "p99_ratio": self.p99_ratio, "min_window": self.min_window}
        for key, value in (("psi", self.psi), ("nan_points", self.nan_points),
                           ("agreement", self.agreement)):
            if value is not None:
                wire[key] = value
        return wire

    @classmethod
    def from_wire(cls, obj: Any) -> GuardThresholds:
        if obj is None:
            return cls()
        return cls(float(obj["error_points"]), float(obj["p99_ratio"]), int(obj["min_window"]),
                   *(None if obj.get(k) is None else float(obj[k])
                     for k in ("psi", "nan_points", "agreement")))


@dataclass(frozen=True, slots=True)
class RolloutPolicy:
    """Which version takes traffic: ``stable``, plus ``canary`` on ``percent`` of it and a
    ``shadow`` that sees copies. ``previous`` is the stable a promotion replaced (where a
    rollback with no canary goes back to). ``epoch`` rises with every change, so workers
    report which policy they apply; construction refuses an inconsistent policy."""

    stable: str = DEFAULT_LABEL
    canary: str | None = None
    percent: float = 0.0
    shadow: str | None = None
    previous: str | None = None
    epoch: int = 0
    guard: GuardThresholds = field(default_factory=GuardThresholds)

    def __post_init__(self) -> None:
        for what, label in (("stable", self.stable), ("canary", self.canary),
                            ("shadow", self.shadow)):
            if label is not None and not _LABEL.fullmatch(label):
                raise ValidationError(f"{what} version {label!r} is not a version label "
                                      "(letters, digits, '.', '_', '-')")
        if not 0.0 <= self.percent <= 100.0:
            raise ValidationError(f"canary percent {self.percent} must be between 0 and 100")
        if self.canary is None and self.percent:
            raise ValidationError("a canary percent needs a canary version (--canary V)")
        if self.canary is not None and self.canary == self.stable:
            raise ValidationError(f"the canary {self.canary!r} is already the stable version")
        if self.shadow is not None and self.shadow == self.stable:
            raise ValidationError(f"the shadow {self.shadow!r} is the stable version: "
                                  "it would compare a version with itself")

    @property
    def labels(self) -> tuple[str, ...]:
        """The versions this policy names: stable, then canary and shadow when set."""
        return tuple(v for v in (self.stable, self.canary, self.shadow) if v is not None)

    def to_wire(self) -> dict[str, Any]:
        return {"stable": self.stable, "canary": self.canary, "percent": self.percent,
                "shadow": self.shadow, "previous": self.previous, "epoch": self.epoch,
                "guard": self.guard.to_wire()}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> RolloutPolicy:
        """Also reads the ``{stable, epoch}`` records written before canaries existed."""
        canary, shadow, previous = obj.get("canary"), obj.get("shadow"), obj.get("previous")
        return cls(str(obj["stable"]), None if canary is None else str(canary),
                   float(obj.get("percent") or 0.0), None if shadow is None else str(shadow),
                   None if previous is None else str(previous), int(obj["epoch"]),
                   GuardThresholds.from_wire(obj.get("guard")))


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """One entry of a model's policy history: the policy it set, by whom, when and why."""

    at: float
    who: str
    why: str
    action: str
    policy: RolloutPolicy

    def to_wire(self) -> dict[str, Any]:
        return {"at": self.at, "who": self.who, "why": self.why, "action": self.action,
                "policy": self.policy.to_wire()}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> PolicyChange:
        return cls(float(obj["at"]), str(obj["who"]), str(obj["why"]), str(obj["action"]),
                   RolloutPolicy.from_wire(obj["policy"]))


def decode_history(raw: Sequence[bytes]) -> list[PolicyChange]:
    """History entries (newest first) from the list's values; ValidationError if malformed."""
    try:
        return [PolicyChange.from_wire(msgpack.unpackb(item, raw=False)) for item in raw]
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise ValidationError(f"a policy history entry is malformed: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Pause:
    """An operator paused the model's lanes: workers stop fetching them until resumed."""

    at: float
    who: str
    why: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"at": self.at, "who": self.who, "why": self.why}


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """Everything the fleet knows about one model."""

    name: str
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    declared: Declaration | None = None
    served: dict[str, Serving] = field(default_factory=dict)
    policy: RolloutPolicy = field(default_factory=RolloutPolicy)
    lane_shards: int = 1
    #: High-water mark of ``lane_shards``: shards ``0..lane_shards_max-1`` may hold entries.
    lane_shards_max: int = 1
    paused: Pause | None = None

    @property
    def consumed_shards(self) -> int:
        """How many shard streams of each lane workers read: every one that may hold work."""
        return max(1, self.lane_shards, self.lane_shards_max)

    @property
    def declared_input(self) -> TensorSpec | None:
        """The spec a submit is checked against: only a declared one (what a worker
        serves is checked by the worker, which answers a wrong input with a result)."""
        return self.declared.input if self.declared is not None else None

    def live_workers(self, now: float, within_s: float = SERVED_WITHIN_S) -> list[str]:
        return sorted(w for w, s in self.served.items() if s.live(now, within_s))

    def summary(self, now: float) -> dict[str, Any]:
        """The discovery entry (``GET /v1/models``): the input and output specs a caller
        needs (declared, else the stable version's), versions, policy, live workers."""
        stable = self.versions.get(self.policy.stable)
        declared = self.declared
        spec_in = declared.input if declared and declared.input else (stable and stable.input)
        spec_out = (declared.output if declared and declared.output
                    else (stable and stable.output))
        return {
            "name": self.name, "declared": declared is not None,
            "input": _spec_wire(spec_in or None), "output": _spec_wire(spec_out or None),
            "versions": [{"label": label, **v.to_wire()}
                         for label, v in sorted(self.versions.items())],
            "policy": self.policy.to_wire(),
            "workers": [{"worker": s.worker_id, "labels": list(s.labels), "last_seen": s.at}
                        for s in sorted(self.served.values(), key=lambda s: s.worker_id)
                        if s.live(now)],
        }

    def to_json(self, now: float) -> dict[str, Any]:
        """The ``models show --json`` form; ``served[].live`` is judged at ``now``."""
        return {
            "name": self.name,
            "versions": {label: v.to_wire() for label, v in sorted(self.versions.items())},
            "declared": None if self.declared is None else self.declared.to_wire(),
            "served": [{"worker": s.worker_id, "last_seen": s.at, "labels": list(s.labels),
                        "live": s.live(now), "loaded": s.loaded is not False}
                       for s in sorted(self.served.values(), key=lambda s: s.worker_id)],
            "policy": self.policy.to_wire(),
            "lane_shards": self.lane_shards,
            "lane_shards_max": self.lane_shards_max,
        }


def _spec_wire(spec: TensorSpec | None) -> dict[str, Any] | None:
    return None if spec is None else spec.to_wire()


def pack(value: Mapping[str, Any]) -> bytes:
    return msgpack.packb(dict(value), use_bin_type=True)  # type: ignore[no-any-return]


def encode_served(labels: Sequence[str], at: float, loaded: bool | None = None) -> bytes:
    """A ``served:{worker_id}`` value (``loaded`` only from a worker loading on demand)."""
    value: dict[str, Any] = {"at": at, "labels": list(labels)}
    return pack(value if loaded is None else {**value, "loaded": loaded})


def decode_record(name: str, fields: Mapping[Any, Any]) -> ModelRecord | None:
    """A record from the hash's fields (HGETALL); None for an empty hash. Raises
    ValidationError for a field that is not what docs/wire-format.md says."""
    if not fields:
        return None
    versions: dict[str, ModelVersion] = {}
    served: dict[str, Serving] = {}
    declared: Declaration | None = None
    policy = RolloutPolicy()
    lane_shards = lane_shards_max = 1
    paused: Pause | None = None
    for raw_key, raw in fields.items():
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        try:
            if key == F_LANE_SHARDS:
                lane_shards = int(raw)
                continue
            if key == F_LANE_SHARDS_MAX:
                lane_shards_max = int(raw)
                continue
            if not (key.startswith((VERSION_PREFIX, SERVED_PREFIX))
                    or key in (F_DECLARED, F_POLICY, F_PAUSED)):
                continue  # a later version's field: ignored, as the wire doc promises
            value = msgpack.unpackb(raw, raw=False)
            if key.startswith(VERSION_PREFIX):
                label = key[len(VERSION_PREFIX):]
                versions[label] = ModelVersion(label, str(value["version"]),
                                               TensorSpec.from_wire(value.get("input")),
                                               TensorSpec.from_wire(value.get("output")),
                                               str(value.get("source") or ""))
            elif key.startswith(SERVED_PREFIX):
                worker = key[len(SERVED_PREFIX):]
                loaded = value.get("loaded")
                served[worker] = Serving(worker, float(value["at"]),
                                         tuple(str(x) for x in value.get("labels", ())),
                                         None if loaded is None else bool(loaded))
            elif key == F_DECLARED:
                declared = Declaration(float(value["at"]), TensorSpec.from_wire(value.get("input")),
                                       TensorSpec.from_wire(value.get("output")))
            elif key == F_POLICY:
                policy = RolloutPolicy.from_wire(value)
            elif key == F_PAUSED:
                paused = Pause(float(value["at"]), str(value["who"]), str(value.get("why", "")))
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
            raise ValidationError(f"model {name!r}: registry field {key!r} is malformed: {exc}"
                                  ) from exc
    return ModelRecord(name, versions, declared, served, policy, lane_shards, lane_shards_max,
                       paused)


Interface = Literal["sdk", "cli", "http"]


class UnregisteredModelError(UnknownModelError):
    """A submit names a model no worker serves and nobody declared. Keeps the name and the
    known ones, so each interface words its own advice (:meth:`advice`)."""

    def __init__(self, model: str, known: Iterable[str]) -> None:
        self.model = model
        self.known = sorted(known)
        super().__init__(self.advice("sdk"))

    def advice(self, interface: Interface) -> str:
        """What to do, in the words of the interface it is shown in: the SDK can be told
        not to check; the CLI and the HTTP API point at declaring the model."""
        known = ", ".join(self.known) or "none yet"
        declare = f"`batchfleet models declare {self.model} --input DTYPE[SHAPE]`"
        # Over HTTP the other models are not listed: they may be other tenants' business.
        listed = "" if interface == "http" else f" (known models: {known})"
        head = f"no worker serves model {self.model!r}{listed} and it is not declared"
        if interface == "sdk":
            return (f"{head}; start a worker with --model {self.model}, declare it with "
                    f"{declare}, or create the client with check_model=False")
        return f"{head}; declare it with {declare}, or start a worker with --model {self.model}"
