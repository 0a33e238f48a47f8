"""A pipeline: a named graph of model steps and joins, declared once, submitted like a model.

A pipeline lives in the model registry's namespace (docs/pipelines.md): declaring one
whose name is a model is refused, and so is declaring a model whose name is a pipeline.
This module is the record and its checks, all pure: parsing the TOML file and the
``--steps A,B@V,C`` shorthand, the graph rules (known sources, no cycles, one output),
the edge spec check against declared specs, and the msgpack codec the registry stores.

A node is a *step* (a model, optionally pinned to a version label) or a *join* (waits
for all of its sources and combines them: ``concatenate``, ``stack``, ``mean`` or a
``module:function``). A source is ``input`` (the pipeline's input), ``STEP`` (that
step's whole output) or ``STEP.NAME`` (one named tensor of it).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.schemas.validation import check_model_name

#: The source that names the pipeline's own input.
INPUT: Final = "input"
#: The joins built in; anything else must be ``module:function``.
JOINS: Final = ("concatenate", "stack", "mean")
_FUNCTION: Final = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", re.ASCII)
_NODE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)
#: Wire version of the stored record; a reader refuses a later major one.
RECORD_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Node:
    """One step (``model`` set) or join (``join`` set), fed by ``sources``."""

    name: str
    sources: tuple[str, ...]
    model: str | None = None
    version: str | None = None
    join: str | None = None

    @property
    def target(self) -> str:
        """What the step's requests are submitted to: ``MODEL`` or ``MODEL@VERSION``."""
        if self.model is None:
            raise ValidationError(f"node {self.name!r} is a join, not a model step")
        return self.model if self.version is None else f"{self.model}@{self.version}"

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "from": list(self.sources), "model": self.model,
                "version": self.version, "join": self.join}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A checked pipeline: nodes in a topological order, the last one its output."""

    name: str
    nodes: tuple[Node, ...]
    keep_intermediate_s: float = 0.0
    declared_at: float = 0.0
    _by_name: dict[str, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_model_name(self.name)
        if self.keep_intermediate_s < 0:
            raise ValidationError(f"pipeline {self.name!r}: keep_intermediate_s must be >= 0")
        ordered = _ordered(self.name, self.nodes)
        object.__setattr__(self, "nodes", ordered)
        object.__setattr__(self, "_by_name", {n.name: n for n in ordered})

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValidationError(f"pipeline {self.name!r} has no step {name!r}") from None

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    @property
    def entry(self) -> tuple[Node, ...]:
        """The nodes fed by the pipeline's input: enqueued when a request is submitted."""
        return tuple(n for n in self.nodes if any(_step_of(s) == INPUT for s in n.sources))

    def successors(self, name: str) -> tuple[Node, ...]:
        """The nodes that read ``name``'s output (fan-out: several)."""
        return tuple(n for n in self.nodes if any(_step_of(s) == name for s in n.sources))

    @property
    def models(self) -> tuple[str, ...]:
        """The models the steps name, once each, in order."""
        return tuple(dict.fromkeys(n.model for n in self.nodes if n.model is not None))

    def to_wire(self) -> dict[str, Any]:
        return {"v": RECORD_VERSION, "name": self.name,
                "nodes": [n.to_wire() for n in self.nodes],
                "keep_intermediate_s": self.keep_intermediate_s, "at": self.declared_at}

    def encode(self) -> bytes:
        return msgpack.packb(self.to_wire(), use_bin_type=True)  # type: ignore[no-any-return]

    def describe(self) -> str:
        """One line: ``tok -> enc`` for a chain, ``a, b -> avg(mean)`` for a join."""
        parts = []
        for n in self.nodes:
            what = n.target if n.model is not None else f"{n.join}"
            srcs = ",".join(n.sources)
            parts.append(f"{n.name}={what}<-{srcs}")
        return "; ".join(parts)


def decode(raw: bytes) -> Pipeline:
    """A stored record back; ValidationError for one this version cannot read."""
    try:
        obj = msgpack.unpackb(raw, raw=False)
        if int(obj.get("v", 1)) > RECORD_VERSION:
            raise ValidationError(f"pipeline record version {obj['v']} is newer than this "
                                  f"batchfleet reads ({RECORD_VERSION})")
        nodes = tuple(Node(str(n["name"]), tuple(str(s) for s in n["from"]), n.get("model"),
                           n.get("version"), n.get("join")) for n in obj["nodes"])
        return Pipeline(str(obj["name"]), nodes, float(obj.get("keep_intermediate_s") or 0),
                        float(obj.get("at") or 0))
    except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
        raise ValidationError(f"a pipeline record is malformed: {exc}") from exc


def from_steps(name: str, steps: str, keep_intermediate_s: float = 0.0) -> Pipeline:
    """``--steps A,B@V,C``: a linear chain; each step is named after its model (``B-2``
    for a model's second appearance)."""
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    previous = INPUT
    for item in (s.strip() for s in steps.split(",")):
        if not item:
            raise ValidationError(f"--steps {steps!r}: an empty step")
        model, version = _target(item)
        seen[model] = seen.get(model, 0) + 1
        node_name = model if seen[model] == 1 else f"{model}-{seen[model]}"
        nodes.append(Node(node_name, (previous,), model, version))
        previous = node_name
    return Pipeline(name, tuple(nodes), keep_intermediate_s)


def from_toml(name: str, text: str, keep_intermediate_s: float | None = None) -> Pipeline:
    """The ``--file pipeline.toml`` form (docs/pipelines.md): ``[[step]]`` tables with
    ``name``, ``model`` (``MODEL`` or ``MODEL@VERSION``) or ``join``, and ``from`` (one
    source or a list; by default the step before, or ``input`` for the first), plus an
    optional top-level ``keep_intermediate_s``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"pipeline file: {exc}") from exc
    unknown = set(doc) - {"step", "keep_intermediate_s"}
    if unknown:
        raise ValidationError(f"pipeline file: unknown key(s) {', '.join(sorted(unknown))}")
    steps = doc.get("step")
    if not isinstance(steps, list) or not steps:
        raise ValidationError("pipeline file: no [[step]] tables")
    nodes: list[Node] = []
    previous = INPUT
    for i, table in enumerate(steps, 1):
        nodes.append(_node(i, table, previous))
        previous = nodes[-1].name
    keep = doc.get("keep_intermediate_s", 0.0) if keep_intermediate_s is None \
        else keep_intermediate_s
    if not isinstance(keep, int | float):
        raise ValidationError("pipeline file: keep_intermediate_s must be a number of seconds")
    return Pipeline(name, tuple(nodes), float(keep))


def _node(i: int, table: Any, previous: str) -> Node:
    if not isinstance(table, Mapping):
        raise ValidationError(f"pipeline file: step {i} is not a table")
    extra = set(table) - {"name", "model", "join", "from", "version"}
    if extra:
        raise ValidationError(f"pipeline file: step {i} has unknown key(s) "
                              f"{', '.join(sorted(extra))}")
    model, join = table.get("model"), table.get("join")
    if (model is None) == (join is None):
        raise ValidationError(f"pipeline file: step {i} needs exactly one of model or join")
    raw_from = table.get("from", previous)
    sources = (raw_from,) if isinstance(raw_from, str) else tuple(raw_from)
    if not sources or not all(isinstance(s, str) for s in sources):
        raise ValidationError(f"pipeline file: step {i}: from must be a name or a list of names")
    if model is not None:
        if not isinstance(model, str):
            raise ValidationError(f"pipeline file: step {i}: model must be a string")
        model_name, version = _target(model)
        version = table.get("version", version)
        node_name = table.get("name", model_name)
        return Node(str(node_name), sources, model_name, version)
    if not isinstance(join, str):
        raise ValidationError(f"pipeline file: step {i}: join must be a string")
    return Node(str(table.get("name", f"join{i}")), sources, join=join)


def _target(text: str) -> tuple[str, str | None]:
    model, _, version = text.partition("@")
    check_model_name(model)
    if version and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", version, re.ASCII):
        raise ValidationError(f"step {text!r}: {version!r} is not a version label")
    return model, version or None


def _step_of(source: str) -> str:
    return source.partition(".")[0]


def _ordered(pipeline: str, nodes: Sequence[Node]) -> tuple[Node, ...]:
    """The graph rules, and the nodes in a topological order (Kahn's, stable)."""
    if not nodes:
        raise ValidationError(f"pipeline {pipeline!r} has no steps")
    names = [n.name for n in nodes]
    for n in nodes:
        if not _NODE.fullmatch(n.name) or n.name == INPUT:
            raise ValidationError(f"pipeline {pipeline!r}: {n.name!r} is not a step name "
                                  "(letters, digits, '_', '-'; not 'input')")
        if (n.model is None) == (n.join is None):
            raise ValidationError(f"pipeline {pipeline!r}: step {n.name!r} needs exactly one "
                                  "of a model or a join")
        if n.model is not None and len(n.sources) != 1:
            raise ValidationError(f"pipeline {pipeline!r}: step {n.name!r} takes one source, "
                                  f"got {len(n.sources)} (use a join to combine several)")
        if n.join is not None:
            if len(n.sources) < 2:
                raise ValidationError(f"pipeline {pipeline!r}: join {n.name!r} needs at least "
                                      "two sources")
            if n.join not in JOINS and not _FUNCTION.fullmatch(n.join):
                raise ValidationError(f"pipeline {pipeline!r}: join {n.name!r}: {n.join!r} is "
                                      f"not one of {', '.join(JOINS)} or module:function")
        for s in n.sources:
            if _step_of(s) != INPUT and _step_of(s) not in names:
                raise ValidationError(f"pipeline {pipeline!r}: step {n.name!r} reads {s!r}, "
                                      "which is no step of it")
    dupes = {x for x in names if names.count(x) > 1}
    if dupes:
        raise ValidationError(f"pipeline {pipeline!r}: step name(s) used twice: "
                              f"{', '.join(sorted(dupes))}")
    if not any(_step_of(s) == INPUT for n in nodes for s in n.sources):
        raise ValidationError(f"pipeline {pipeline!r}: no step reads the input")
    pending = {n.name: {_step_of(s) for s in n.sources} - {INPUT} for n in nodes}
    order: list[Node] = []
    while pending:
        ready = [n for n in nodes if n.name in pending and not pending[n.name]]
        if not ready:
            raise ValidationError(f"pipeline {pipeline!r} has a cycle through "
                                  f"{', '.join(sorted(pending))}")
        for n in ready:
            order.append(n)
            del pending[n.name]
            for deps in pending.values():
                deps.discard(n.name)
    used = {_step_of(s) for n in nodes for s in n.sources}
    sinks = [n.name for n in order if n.name not in used]
    if len(sinks) != 1:
        raise ValidationError(f"pipeline {pipeline!r} must end in one step (its output); "
                              f"{', '.join(sinks)} all end it: join them")
    return tuple(order)  # every node reaches the one sink, so it comes last


Specs = Mapping[str, tuple[TensorSpec | None, TensorSpec | None]]


def check_edges(pipeline: Pipeline, specs: Specs) -> list[str]:
    """Check every edge whose two ends have declared specs; ``specs`` maps a step's
    target (``MODEL`` or ``MODEL@VERSION``, else ``MODEL``) to its (input, output) specs.

    Raises ValidationError naming the first incompatible edge (``edge tok -> enc: ...``);
    returns the edges it could not check (an end without a spec), which are checked on
    the first request that crosses them."""
    out: dict[str, TensorSpec | None] = {}
    unchecked: list[str] = []
    pipe_input: TensorSpec | None = None
    for n in pipeline.nodes:
        if n.model is not None:
            spec_in, spec_out = specs.get(n.target) or specs.get(n.model) or (None, None)
            source = n.sources[0]
            if "." in source:  # a named tensor of a step: no spec names tensors yet
                unchecked.append(f"{source} -> {n.name}")
            elif source == INPUT:
                if spec_in is not None and pipe_input is not None and spec_in != pipe_input:
                    raise ValidationError(
                        f"edge input -> {n.name}: {n.name} takes {spec_in.describe()}, another "
                        f"entry step takes {pipe_input.describe()}")
                pipe_input = pipe_input or spec_in
            else:
                _edge(source, n.name, out.get(source), spec_in, unchecked)
            out[n.name] = spec_out
        else:
            out[n.name] = _join_spec(n, [out.get(_step_of(s)) if "." not in s else None
                                         for s in n.sources], unchecked)
    return unchecked


def _edge(src: str, dst: str, have: TensorSpec | None, want: TensorSpec | None,
          unchecked: list[str]) -> None:
    if have is None or want is None:
        unchecked.append(f"{src} -> {dst}")
    elif have != want:
        raise ValidationError(f"edge {src} -> {dst}: {src} outputs {have.describe()}, "
                              f"{dst} takes {want.describe()}")


def _join_spec(n: Node, ins: list[TensorSpec | None], unchecked: list[str]
               ) -> TensorSpec | None:
    """A join's output spec from its inputs' (None where any is unknown or it is a
    user function); refuses inputs the join cannot combine."""
    if any(s is None for s in ins) or n.join not in JOINS:
        unchecked.extend(f"{s} -> {n.name}" for s in n.sources)
        return None
    specs = [s for s in ins if s is not None]
    first = specs[0]
    for src, s in zip(n.sources[1:], specs[1:], strict=True):
        same = s == first if n.join != "concatenate" else (
            s.dtype == first.dtype and s.shape[1:] == first.shape[1:] and len(s.shape) > 0)
        if not same:
            raise ValidationError(f"edge {src} -> {n.name}: {n.join} of {first.describe()} "
                                  f"and {s.describe()}")
    if n.join == "mean":
        return first
    if n.join == "stack":
        return TensorSpec(first.dtype, (len(specs), *first.shape))
    if not first.shape:
        raise ValidationError(f"edge {n.sources[0]} -> {n.name}: cannot concatenate scalars")
    return TensorSpec(first.dtype, (sum(s.shape[0] for s in specs), *first.shape[1:]))


def specs_from_records(pipeline: Pipeline, records: Mapping[str, Any]) -> Specs:
    """Each step's (input, output) specs from its model's registry record
    (``schemas.registry.ModelRecord``): a pinned version's registered specs, else the
    declared ones, else the stable version's. Raises ValidationError for a step whose
    model has no record, or whose pinned version its workers never registered."""
    specs: dict[str, tuple[TensorSpec | None, TensorSpec | None]] = {}
    for n in pipeline.nodes:
        if n.model is None:
            continue
        record = records.get(n.model)
        if record is None:
            raise ValidationError(
                f"step {n.name!r}: model {n.model!r} is not in the registry; declare it "
                f"with `batchfleet models declare {n.model} --input-spec DTYPE[SHAPE]` or "
                f"start a worker with --model {n.model}")
        if n.version is not None:
            version = record.versions.get(n.version)
            if version is None and record.versions:
                raise ValidationError(
                    f"step {n.name!r}: model {n.model!r} has no version {n.version!r}; "
                    f"registered: {', '.join(sorted(record.versions))}")
            specs[n.target] = (None, None) if version is None else (version.input,
                                                                    version.output)
            continue
        declared = record.declared
        stable = record.versions.get(record.policy.stable)
        spec_in = (declared.input if declared and declared.input else
                   (stable.input if stable else None))
        spec_out = (declared.output if declared and declared.output else
                    (stable.output if stable else None))
        specs[n.target] = (spec_in, spec_out)
    return specs
