"""Turning ``--model`` specs into handlers.

Accepted forms:

* ``demo-mlp`` / ``demo-encoder``: a built-in model under its own name;
* ``NAME=demo-mlp``: a built-in under another name;
* ``NAME=package.module:factory``: a factory returning a handler or an ``nn.Module``;
* ``NAME=path/to/model.pt``: TorchScript (``torch.jit.save``) or ``torch.export`` (``.pt2``).

Every failure here is a :class:`ConfigError` raised at start-up, so a worker
never starts serving a model it could not load.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from schemas.errors import ConfigError
from schemas.names import check_model_name
from workers.models.builtin import BUILTIN_MODELS
from workers.models.handler import ModelHandler, TorchModuleHandler


def parse_model_spec(spec: str) -> tuple[str, str]:
    """Split ``NAME=SOURCE``; a bare built-in name is its own source."""
    name, sep, source = spec.partition("=")
    name, source = name.strip(), source.strip()
    if not sep:
        source = name
    if not name or not source:
        raise ConfigError(f"--model {spec!r}: expected NAME=module:factory, NAME=file.pt or a "
                          f"built-in ({', '.join(BUILTIN_MODELS)})")
    try:
        check_model_name(name)
    except Exception as exc:
        raise ConfigError(f"--model {spec!r}: {exc}") from exc
    return name, source


def load_model(spec: str, max_batch_size: int = 1024) -> ModelHandler:
    name, source = parse_model_spec(spec)
    if source in BUILTIN_MODELS:
        return BUILTIN_MODELS[source](name, max_batch_size)
    if source.endswith((".pt", ".pt2", ".pth", ".ts")) or Path(source).exists():
        return TorchModuleHandler(name, _load_file(name, Path(source)),
                                  max_batch_size=max_batch_size)
    if ":" in source:
        return _from_factory(name, source, max_batch_size)
    raise ConfigError(
        f"--model {spec!r}: {source!r} is not a built-in ({', '.join(BUILTIN_MODELS)}), "
        "a module:factory or an existing .pt file"
    )


def load_models(specs: list[str] | tuple[str, ...], max_batch_size: int = 1024
                ) -> dict[str, ModelHandler]:
    handlers: dict[str, ModelHandler] = {}
    for spec in specs:
        handler = load_model(spec, max_batch_size)
        if handler.name in handlers:
            raise ConfigError(f"model {handler.name!r} is given twice")
        handlers[handler.name] = handler
    if not handlers:
        raise ConfigError("no models given: pass --model demo-mlp (or set BATCHFLEET_MODELS)")
    return handlers


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
        raise ConfigError(f"model {name!r}: cannot import {source}: {exc}") from exc
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
