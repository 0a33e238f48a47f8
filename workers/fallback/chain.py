"""The fallback chain and trigger grammar, and the checks made of it at start-up. Pure.

``--fallback [MODEL[@VERSION]=]CHAIN``: steps separated by ``|`` (never inside brackets,
so ``value:[0.5,0.5]`` stays whole), tried in order until one answers:
``cache``, ``model:NAME[@VERSION]``, ``rules:module:function``, ``value:JSON``, ``fail``.
An empty chain is ``fail``: nothing changes for a model without ``--fallback``.

``--degrade-on [MODEL=]TRIGGERS``: ``error``, ``breaker``, ``deadline``, ``overload``
joined with ``+`` (a comma separates per-model entries), or ``all`` (the default).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.per_model import split_top_level

TRIGGERS: Final = ("error", "breaker", "deadline", "overload")
STEP_KINDS: Final = ("cache", "model", "rules", "value", "fail")
#: Steps cheap enough to answer an overload (no model runs).
CHEAP: Final = frozenset({"cache", "rules", "value"})
#: Steps that compute nothing in this process: all a quarantined (``crash_loop``)
#: request may be answered by, since it may kill whatever computes it.
INERT: Final = frozenset({"cache", "value"})


@dataclass(frozen=True, slots=True)
class Step:
    """One step: its kind and its argument (``model``: NAME[@VERSION]; ``rules``:
    module:function; ``value``: the JSON text)."""

    kind: str
    arg: str = ""

    @property
    def name(self) -> str:
        """What a degraded result's ``fallback`` says: ``value`` (not its JSON), ``cache``,
        ``model:NAME@VERSION``, ``rules:module:function``."""
        return self.kind if self.kind in ("value", "cache", "fail") else f"{self.kind}:{self.arg}"

    def target(self) -> tuple[str, str | None]:
        """A ``model`` step's (model, version label or None)."""
        name, _, version = self.arg.partition("@")
        return name, version or None


@dataclass(frozen=True, slots=True)
class FallbackChain:
    steps: tuple[Step, ...] = ()

    @property
    def active(self) -> bool:
        """Does any step answer (a chain of ``fail`` alone is the default, fail closed)?"""
        return any(s.kind != "fail" for s in self.steps)

    def answering(self, cheap_only: bool = False, skip_model: str | None = None,
                  inert_only: bool = False) -> tuple[Step, ...]:
        """The steps to try, up to the first ``fail``: only cheap ones under overload, only
        inert ones for a quarantined request, and never a ``model:`` step naming
        ``skip_model`` (its breaker is open)."""
        out: list[Step] = []
        for step in self.steps:
            if step.kind == "fail":
                break
            if (cheap_only and step.kind not in CHEAP) or (
                    inert_only and step.kind not in INERT):
                continue
            if step.kind == "model" and skip_model is not None and \
                    step.target()[0] == skip_model:
                continue
            out.append(step)
        return tuple(out)


def parse_step(text: str) -> Step:
    raw = text.strip()
    kind, sep, arg = raw.partition(":")
    kind = kind.strip()
    if kind not in STEP_KINDS:
        raise ValueError(f"unknown step {raw!r} (steps: cache, model:NAME[@VERSION], "
                         "rules:module:function, value:JSON, fail)")
    if kind in ("cache", "fail"):
        if sep:
            raise ValueError(f"step {kind!r} takes no argument, got {raw!r}")
        return Step(kind)
    if not arg.strip():
        raise ValueError(f"step {kind!r} needs an argument: {kind}:...")
    arg = arg.strip()
    if kind == "rules" and (arg.count(":") != 1 or not all(arg.split(":"))):
        raise ValueError(f"rules step {raw!r} must be rules:module:function")
    if kind == "value":
        try:
            json.loads(arg)
        except ValueError as exc:
            raise ValueError(f"value step {raw!r} is not JSON: {exc}") from None
    if kind == "model" and (arg.count("@") > 1 or not arg.partition("@")[0]):
        raise ValueError(f"model step {raw!r} must be model:NAME[@VERSION]")
    return Step(kind, arg)


def parse_chain(text: str) -> FallbackChain:
    """``STEP|STEP|...``; ``""`` is the default ``fail``. Raises ``ValueError``."""
    if not text.strip():
        return FallbackChain()
    steps = tuple(parse_step(part) for part in split_top_level(text, "|"))
    if len({s for s in steps}) != len(steps):
        raise ValueError(f"chain {text!r} repeats a step")
    return FallbackChain(steps)


def check_chain_text(text: str) -> str:
    """The settings' parser: the text, once its grammar is known good."""
    parse_chain(text)
    return text.strip()


def parse_triggers(text: str) -> frozenset[str]:
    """``error+breaker``, ``all`` or ``none``. Raises ``ValueError``."""
    raw = text.strip().lower()
    if raw in ("", "all"):
        return frozenset(TRIGGERS)
    if raw == "none":
        return frozenset()
    names = [t.strip() for t in raw.replace("|", "+").split("+")]
    unknown = [t for t in names if t not in TRIGGERS]
    if unknown:
        raise ValueError(f"unknown trigger(s) {', '.join(map(repr, unknown))} "
                         f"(triggers: {', '.join(TRIGGERS)}, joined with '+'; or all, none)")
    return frozenset(names)


def check_triggers_text(text: str) -> str:
    parse_triggers(text)
    return text.strip()


# --- start-up checks --------------------------------------------------------------------

#: What the checks need of a handler: its input spec (dtype, shape) or None.
SpecOf = Callable[[str, str | None], Any]


def load_rules(path: str) -> Callable[[Any], Any]:
    """The function of ``module:function``; ``ConfigError`` when it cannot be imported."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is a start-up refusal, in one line
        raise ConfigError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def check_chain(model: str, chain: FallbackChain,
                versions: Mapping[str, Mapping[str, Any]], *, cache_on: bool) -> None:
    """Refuse a chain this worker cannot run, in one line naming the model and the step:
    a ``model:`` step on a model or version it does not hold or whose input spec differs,
    an unimportable ``rules`` function, a ``cache`` step without the result cache."""
    own = _spec(next(iter(versions[model].values())))
    for step in chain.steps:
        where = f"--fallback {model}={step.name}"
        if step.kind == "model":
            name, label = step.target()
            held = versions.get(name)
            if held is None or (label is not None and label not in held):
                raise ConfigError(f"{where}: this worker does not hold {step.arg!r} "
                                  f"(it holds: {', '.join(_held(versions))})")
            if name == model and (label is None or label == next(iter(held))):
                raise ConfigError(f"{where}: a model cannot fall back on its own version")
            other = _spec(held[label] if label else next(iter(held.values())))
            if own != other:
                raise ConfigError(f"{where}: its input spec {_show(other)} differs from "
                                  f"{model}'s {_show(own)}")
        elif step.kind == "rules":
            try:
                load_rules(step.arg)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        elif step.kind == "cache" and not cache_on:
            raise ConfigError(f"{where}: the cache step needs the result cache "
                              f"(--cache-ttl-s {model}=SECONDS)")


def check_value(model: str, step: Step, reference: Any) -> np.ndarray[Any, Any]:
    """A ``value`` step's constant as an array shaped and typed like ``reference`` (the
    model's output for one request; None: unknown, taken as given)."""
    value = np.asarray(json.loads(step.arg))
    if reference is None:
        return value.astype(np.float32) if value.dtype.kind == "f" else value
    if isinstance(reference, Mapping):
        raise ConfigError(f"--fallback {model}=value:{step.arg}: the model's output is named "
                          "tensors; a value step answers a single tensor")
    ref = np.asarray(reference)
    if value.shape != ref.shape:
        raise ConfigError(f"--fallback {model}=value:{step.arg}: shape {list(value.shape)} "
                          f"differs from the model's output shape {list(ref.shape)}")
    try:
        return value.astype(ref.dtype, casting="same_kind" if ref.dtype.kind == "f" else "safe")
    except TypeError:
        raise ConfigError(f"--fallback {model}=value:{step.arg}: {value.dtype} values do not "
                          f"fit the model's output dtype {ref.dtype}") from None


def _spec(handler: Any) -> Any:
    spec = getattr(handler, "input_spec", None)
    return None if spec is None else (str(spec.dtype), tuple(spec.shape))


def _show(spec: Any) -> str:
    return "unknown" if spec is None else f"{spec[0]}{list(spec[1])}"


def _held(versions: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [f"{m}@{label}" for m, labels in versions.items() for label in labels]
