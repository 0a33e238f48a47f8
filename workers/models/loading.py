"""Turning ``--model`` specs into handlers.

Accepted forms:

* ``demo-mlp`` / ``demo-encoder``: a built-in model under its own name;
* ``NAME=demo-mlp``: a built-in under another name; ``demo-mlp:seed=N`` draws other weights;
* ``NAME=package.module:factory``: a factory returning a handler or an ``nn.Module``,
  imported with the working directory (or ``--app-dir``) first on ``sys.path``, as
  ``python -m`` and uvicorn do: a console script's own path is its ``bin/`` folder;
* ``NAME=path/to/model.pt``: TorchScript (``torch.jit.save``) or ``torch.export`` (``.pt2``);
* ``NAME=path/to/model.onnx``: an ONNX file, run by ONNX Runtime (fp32, or int8 through
  ``--precision int8``), gated against its own fp32 outputs.

Any form may carry a version label, ``NAME@LABEL=SOURCE`` (repeatable per model):
the label is the version's identity for rollout, pinning and rollback, and an
unlabelled spec is ``default``. :func:`load_versions` returns ``{model: {label:
handler}}`` in the order given; each version gets its own ``RuntimeChoice``
(``--runtime MODEL@LABEL=onnx``).

A model that cannot say what it takes (a plain module, a ``.pt``/``.pt2`` file) gets
its ``--input-spec`` here, so intake refuses a wrong dtype or shape instead of the
forward failing (retried, then the DLQ). Each handler is then wrapped for its
:class:`RuntimeChoice` (``--runtime``, ``--precision``; see :mod:`.runtimes`).

Every failure here is a :class:`ConfigError` raised at start-up, so a worker
never starts serving a model it could not load.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from batchfleet.schemas.envelopes import check_version_label
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import check_model_name
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.schemas.tensor_spec import TensorSpec
from batchfleet.workers.models.builtin import BUILTIN_MODELS
from batchfleet.workers.models.handler import ModelHandler, TorchModuleHandler
from batchfleet.workers.models.lazy import ResidentHandler
from batchfleet.workers.models.runtimes import RuntimeChoice, RuntimeHandler, apply_runtime

#: Per-version runtime choice, by model name and version label.
ChoiceFor = Callable[[str, str], RuntimeChoice]
#: Per-version ``--input-spec``, by model name and version label (None: not given).
SpecFor = Callable[[str, str], TensorSpec | None]


def add_app_dir(app_dir: str | Path | None = None) -> str:
    """Put ``app_dir`` (default: the working directory) first on ``sys.path``, once, so a
    ``module:factory`` beside the user's files imports with no ``PYTHONPATH``. Returns
    the directory added."""
    path = str(Path(app_dir or os.getcwd()).resolve())
    if app_dir and not Path(path).is_dir():
        raise ConfigError(f"--app-dir {app_dir}: no such directory")
    if path not in sys.path:
        sys.path.insert(0, path)
    return path


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One ``--model NAME[@LABEL]=SOURCE``."""

    name: str
    label: str
    source: str


def split_model_spec(spec: str) -> ModelSpec:
    """Split ``NAME[@LABEL]=SOURCE``; a bare built-in name is its own source."""
    head, sep, source = spec.partition("=")
    name, at, label = head.strip().partition("@")
    name, label, source = name.strip(), label.strip(), source.strip()
    if not sep:
        source = name
    if not name or not source or (at and not label):
        raise ConfigError(f"--model {spec!r}: expected NAME[@VERSION]=module:factory, "
                          f"NAME=file.pt or a built-in ({', '.join(BUILTIN_MODELS)})")
    try:
        check_model_name(name)
        if at:
            check_version_label(label)
    except Exception as exc:
        raise ConfigError(f"--model {spec!r}: {exc}") from exc
    return ModelSpec(name, label or DEFAULT_LABEL, source)


def parse_model_spec(spec: str) -> tuple[str, str]:
    """``(NAME, SOURCE)`` of ``NAME[@LABEL]=SOURCE`` (the label: :func:`split_model_spec`)."""
    parsed = split_model_spec(spec)
    return parsed.name, parsed.source


def builtin_source(source: str) -> tuple[str, int | None] | None:
    """``demo-mlp`` -> ("demo-mlp", None); ``demo-mlp:seed=2`` -> ("demo-mlp", 2); else None."""
    base, _, options = source.partition(":")
    if base not in BUILTIN_MODELS:
        return None
    seed: int | None = None
    for option in filter(None, (o.strip() for o in options.split(","))):
        key, _, value = option.partition("=")
        if key.strip() != "seed" or not value.strip().lstrip("-").isdigit():
            raise ConfigError(f"built-in model {source!r}: the only option is seed=N "
                              f"(e.g. {base}:seed=2), got {option!r}")
        seed = int(value)
    return base, seed


def load_model(spec: str, max_batch_size: int = 1024,
               choice: RuntimeChoice | None = None,
               input_spec: TensorSpec | None = None) -> ModelHandler:
    """The handler for one ``--model`` spec, wrapped for ``choice`` (default eager fp32).
    ``input_spec`` (``--input-spec``) is what it takes where it does not say itself."""
    choice = choice or RuntimeChoice()
    name, source = parse_model_spec(spec)
    if source.endswith(".onnx"):
        onnx = _load_onnx(name, Path(source), choice, max_batch_size)
        if input_spec is not None:  # a file whose dims after the batch axis are dynamic
            declare_input(onnx, input_spec)
        return onnx
    handler = _load_eager(name, source, spec, max_batch_size)
    if input_spec is not None:
        declare_input(handler, input_spec)
    return apply_runtime(handler, choice, max_batch_size)


def declare_input(handler: ModelHandler, spec: TensorSpec) -> None:
    """Give ``handler`` the input spec it lacks; refuse one that contradicts its own."""
    own = handler.input_spec
    if own is not None and own != spec:
        raise ConfigError(f"model {handler.name!r} takes {own.describe()}; "
                          f"--input-spec {spec.describe()} contradicts it")
    handler.input_spec = spec


def _load_eager(name: str, source: str, spec: str, max_batch_size: int) -> ModelHandler:
    if (builtin := builtin_source(source)) is not None:
        base, seed = builtin
        factory = BUILTIN_MODELS[base]
        return factory(name, max_batch_size, **({} if seed is None else {"seed": seed}))
    if source.endswith((".pt", ".pt2", ".pth", ".ts")) or Path(source).exists():
        return TorchModuleHandler(name, _load_file(name, Path(source)),
                                  max_batch_size=max_batch_size)
    if ":" in source:
        return _from_factory(name, source, max_batch_size)
    raise ConfigError(
        f"--model {spec!r}: {source!r} is not a built-in ({', '.join(BUILTIN_MODELS)}), "
        "a module:factory or an existing .pt file"
    )


def load_versions(specs: Sequence[str], max_batch_size: int = 1024,
                  runtimes: ChoiceFor | None = None, input_specs: SpecFor | None = None,
                  on_demand: bool = False) -> dict[str, dict[str, ModelHandler]]:
    """``{model: {label: handler}}``, in the order given (a model's first label first).
    ``on_demand``: each a ``ResidentHandler`` that loads from its spec when told
    (``--max-loaded-models``)."""
    versions: dict[str, dict[str, ModelHandler]] = {}
    for spec in specs:
        parsed = split_model_spec(spec)
        labels = versions.setdefault(parsed.name, {})
        if parsed.label in labels:
            what = "" if parsed.label == DEFAULT_LABEL else f" version {parsed.label!r}"
            raise ConfigError(f"model {parsed.name!r}{what} is given twice")
        choice = runtimes(parsed.name, parsed.label) if runtimes else None
        given = input_specs(parsed.name, parsed.label) if input_specs else None
        if on_demand:
            labels[parsed.label] = ResidentHandler(
                parsed.name, partial(load_model, spec, max_batch_size, choice, given))
        else:
            labels[parsed.label] = load_model(spec, max_batch_size, choice, given)
    if not versions:
        raise ConfigError("no models given: pass --model demo-mlp (or set BATCHFLEET_MODELS)")
    return versions


def load_models(specs: Sequence[str], max_batch_size: int = 1024,
                runtimes: ChoiceFor | None = None) -> dict[str, ModelHandler]:
    """One handler per model: its first version (tools that run a single version)."""
    return {name: next(iter(labels.values()))
            for name, labels in load_versions(specs, max_batch_size, runtimes).items()}


def _load_file(name: str, path: Path) -> torch.nn.Module:
    if not path.exists():
        raise ConfigError(f"model {name!r}: file {path} does not exist")
    try:
        if path.suffix == ".pt2":
            return torch.export.load(str(path)).module()
        return torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call,no-any-return]
    except Exception as exc:  # torch raises RuntimeError, zipfile errors, pickle errors...
        raise ConfigError(
            f"model {name!r}: cannot load {path} as TorchScript or torch.export: {exc}"
        ) from exc


def _from_factory(name: str, source: str, max_batch_size: int) -> ModelHandler:
    module_name, _, attr = source.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"model {name!r}: cannot import {source}: {exc} (a worker imports "
                          "it from the working directory, or from --app-dir DIR)") from exc
    try:
        made: Any = factory()
    except Exception as exc:  # user code: any failure is a start-up error
        raise ConfigError(f"model {name!r}: factory {source} raised {exc!r}") from exc
    if isinstance(made, torch.nn.Module):
        return TorchModuleHandler(name, made, max_batch_size=max_batch_size)
    if isinstance(made, ModelHandler):
        made.name = name
        return made
    raise ConfigError(
        f"model {name!r}: factory {source} returned {type(made).__name__}; expected an "
        "nn.Module or a handler with setup/preprocess/predict/postprocess, name, version "
        "and input_spec"
    )


def _load_onnx(name: str, path: Path, choice: RuntimeChoice,
               max_batch_size: int) -> RuntimeHandler:
    """An ``.onnx`` file always runs on ONNX Runtime; its fp32 session is the reference."""
    from batchfleet.workers.models.onnx_runtime import (
        OnnxModule,
        OnnxSession,
        file_version,
        require_onnx,
    )

    if not path.exists():
        raise ConfigError(f"model {name!r}: file {path} does not exist")
    if choice.runtime == "compile":
        raise ConfigError(f"model {name!r}: --runtime compile needs a torch model; "
                          f"{path} is ONNX (use --runtime onnx)")
    require_onnx(name)
    session = OnnxSession(path, torch.device("cpu"))
    handler = TorchModuleHandler(name, OnnxModule(session), version=file_version(path),
                                 input_spec=session.input_spec(),
                                 max_batch_size=max_batch_size)
    onnx_choice = RuntimeChoice("onnx", choice.precision, choice.calibration,
                                choice.accept_accuracy_loss, choice.tolerance)
    return RuntimeHandler(handler, onnx_choice, max_batch_size, onnx_file=path)
