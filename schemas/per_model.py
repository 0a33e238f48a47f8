"""Per-model settings: one value for every model, overridden per model or model version.

The convention, after ``--retry MODEL=...``, is the same for every per-model option:

* ``--flag VALUE`` applies to every model;
* ``--flag MODEL=VALUE`` or ``--flag MODEL@VERSION=VALUE`` applies to one; repeatable;
* the most specific entry wins: ``MODEL@VERSION``, then ``MODEL``, then the bare value;
* the environment form is the same entries, comma-separated:
  ``BATCHFLEET_RETRY="demo-mlp=5:0.1,demo-encoder=2"``;
* a comma inside brackets, braces, parentheses or quotes never separates entries, so
  ``value:[0.5,0.5]`` and ``float32[3,224,224]`` stay whole (:func:`split_top_level`).

This module is pure: it parses those strings and resolves a model's value. Which
models a worker serves is checked by :meth:`PerModel.check_models`, at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from batchfleet.schemas.errors import ConfigError

T = TypeVar("T")

#: (model, version); version None: every version of the model.
ModelKey = tuple[str, str | None]

#: ``MODEL[@VERSION]=VALUE``: a model name never holds ``=``, ``@``, ``:`` or ``/``, so a
#: bare value such as ``5:0.1`` or ``redis://h/0?a=b`` is not mistaken for an entry.
_ENTRY = re.compile(
    r"^(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<version>[^=@\s]+))?\s*=(?P<value>.*)$")


@dataclass(frozen=True, slots=True)
class PerModel(Generic[T]):
    """A default plus overrides keyed by (model, version|None); frozen and hashable."""

    default: T
    overrides: tuple[tuple[ModelKey, T], ...] = ()

    def for_model(self, model: str, version: str | None = None) -> T:
        table = dict(self.overrides)
        for key in ((model, version), (model, None)):
            if key in table:
                return table[key]
        return self.default

    def models(self) -> frozenset[str]:
        """Model names that have an override of their own."""
        return frozenset(model for (model, _), _ in self.overrides)

    def check_models(self, served: Iterable[str], option: str) -> None:
        """Refuse overrides for models this worker does not serve: a typo would otherwise
        silently fall back to the default."""
        names = sorted(set(served))
        unknown = sorted(self.models() - set(names))
        if unknown:
            raise ConfigError(f"{option} names {', '.join(map(repr, unknown))}, which this worker "
                              f"does not serve (it serves: {', '.join(names)})")

    def describe(self, fmt: Callable[[T], str] = str) -> str:
        """``VALUE,MODEL=VALUE,...``: the env form, which :func:`parse_per_model` reads back."""
        parts = [fmt(self.default)] if fmt(self.default) else []
        for (model, version), value in self.overrides:
            key = model if version is None else f"{model}@{version}"
            parts.append(f"{key}={fmt(value)}")
        return ",".join(parts)


_OPEN = {"[": "]", "{": "}", "(": ")"}


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """``text`` split on ``sep`` outside brackets, braces, parentheses and quotes.

    Why: per-model values carry JSON (``value:[0.5,0.5]``) and shapes
    (``float32[3,224,224]``), whose commas are not entry separators. An unbalanced
    closing bracket is kept as text; an unclosed one keeps the rest in one part, so
    the value's own parser reports it rather than a confusing half."""
    parts: list[str] = []
    stack: list[str] = []
    quote = ""
    start = 0
    for i, char in enumerate(text):
        if quote:
            if char == quote and text[i - 1] != "\\":
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in _OPEN:
            stack.append(_OPEN[char])
        elif stack and char == stack[-1]:
            stack.pop()
        elif char == sep and not stack:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def split_entry(entry: str) -> tuple[ModelKey | None, str]:
    """``MODEL[@VERSION]=VALUE`` -> ((model, version), value); a bare value -> (None, value).

    Raises ``ValueError`` for a malformed entry (``=3``, ``a b=3``, ``a=``)."""
    text = entry.strip()
    match = _ENTRY.match(text)
    if match is None:
        if "=" in text and "://" not in text:
            raise ValueError("expected VALUE or MODEL[@VERSION]=VALUE")
        return None, text
    if not match["value"].strip():
        raise ValueError("no value after '='")
    return (match["model"], match["version"]), match["value"].strip()


def parse_per_model(
    entries: Iterable[str], parse: Callable[[str], T], default: T, option: str = "option"
) -> PerModel[T]:
    """Entries as given on the command line (or split from the env var), in order.

    A later entry for the same key replaces an earlier one, as a later flag does.
    ``parse`` turns one value into a ``T`` and raises ``ValueError`` or ``ConfigError``
    with a message; it is reported with the option and the entry.
    """
    table: dict[ModelKey, T] = {}
    for entry in entries:
        if not entry.strip():
            continue
        try:
            key, raw = split_entry(entry)
            value = parse(raw)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{option} {entry.strip()!r}: {exc}") from exc
        if key is None:
            default = value
        else:
            table[key] = value
    return PerModel(default, tuple(table.items()))
