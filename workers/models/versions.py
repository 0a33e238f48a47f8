"""A worker's model versions: ``{model: {label: handler}}``, and what follows from it.

The version-aware handlers API (what routing, shadow, the result cache and metrics
build on, and what the spine hands the compute thread and the registry):

* ``versions[model][label]`` is the handler of one version; a model's first label (in
  ``--model`` order) is where requests go when no routing middleware runs;
* ``handlers[model]`` is that first version's handler (validation, runtime info);
* a version computes in its slot :func:`version_lane` (``demo-mlp@v2``), which is also
  the broker lane only its holders consume (:func:`lanes`);
* a result's ``model_version`` is ``label/sha256:…[/runtime-precision]``
  (:func:`model_version`).

It lives in the model layer, not in the routing middleware, so the spine needs no
middleware to know what it serves.
"""

from __future__ import annotations

from collections.abc import Mapping

from batchfleet.connectors.model_registry import ModelRegistry, served_version
from batchfleet.schemas.registry import ModelVersion
from batchfleet.workers.models.handler import ModelHandler

#: ``{model: {label: handler}}``: every version a worker holds, first label first.
Versions = Mapping[str, Mapping[str, ModelHandler]]


def version_lane(model: str, label: str) -> str:
    """The lane name of one version (``demo-mlp@v2``): its compute slot, and the broker
    lane only its holders consume (``@`` never occurs in a model name)."""
    return f"{model}@{label}"


def slots(versions: Mapping[str, Mapping[str, ModelHandler]]) -> dict[str, ModelHandler]:
    """Every version's handler under its :func:`version_lane` name (the compute thread's)."""
    return {version_lane(m, label): h for m, labels in versions.items()
            for label, h in labels.items()}


def per_model(by_slot: Mapping[str, float]) -> dict[str, float]:
    """Seconds per slot (``model@label``) summed per model."""
    out: dict[str, float] = {}
    for slot, seconds in by_slot.items():
        model = slot.partition("@")[0]
        out[model] = out.get(model, 0.0) + seconds
    return out


def model_version(label: str, handler: ModelHandler) -> str:
    """What a result's ``model_version`` says: ``label/sha256:…[/runtime-precision]``."""
    return f"{label}/{handler.version}"


def lanes(versions: Versions) -> list[str]:
    """What a worker consumes: each model's lane, and each held version's own lane."""
    return [*versions, *(version_lane(m, label) for m, labels in versions.items()
                         for label in labels)]


def registry_versions(versions: Versions) -> dict[str, list[ModelVersion]]:
    """What the worker asserts in the model registry: each held version under its label."""
    return {m: [served_version(h, label) for label, h in labels.items()]
            for m, labels in versions.items()}


async def adopt_declared_specs(versions: Versions, registry: ModelRegistry) -> list[str]:
    """Give each version that cannot say what it takes (a plain module, a ``.pt`` file, no
    ``--input-spec``) the input spec its model was declared with (``batchfleet models
    declare``), so intake refuses what the forward would fail on. Returns the models
    still without one: they are served unchecked, as before."""
    unchecked: list[str] = []
    for model, labels in versions.items():
        if all(h.input_spec is not None for h in labels.values()):
            continue
        record = await registry.get(model)
        declared = record.declared.input if record and record.declared else None
        for handler in labels.values():
            if handler.input_spec is None and declared is not None:
                handler.input_spec = declared
        if any(h.input_spec is None for h in labels.values()):
            unchecked.append(model)
    return unchecked
