"""Settings declared once: the ``opt()`` field metadata every command's options come from.

A settings dataclass declares each field once, with its default and an :func:`opt` in
its metadata. From those the CLI (``batchfleet/settings_options.py``) generates the
typer option, the ``BATCHFLEET_*`` variable, the ``--help`` line, the ``--print-config``
line and the README's tables, so a default, a help text or a variable name is written
nowhere else. Precedence: a flag wins over the variable, the variable over the default.

This module is layer-neutral (it imports nothing but ``schemas``): the worker's,
gateway's and client's settings all declare their fields with it, and the connection
options every command shares (:data:`BROKER`, :data:`RESULTS`, :data:`NAMESPACE`) live
here. It never reads the environment; only the CLI does.

Naming: field ``max_wait_ms`` is ``--max-wait-ms`` and ``BATCHFLEET_MAX_WAIT_MS``. A
field holding a nested settings dataclass (``kafka: KafkaSettings``) prefixes its
children: ``kafka.partitions`` is ``--kafka-partitions`` and ``BATCHFLEET_KAFKA_PARTITIONS``.
``opt(flag=..., env=...)`` overrides either name (the gateway's ``BATCHFLEET_GATEWAY_*``).

The value type picks the parser (``int``, ``float``, ``str``, ``bool``, ``X | None``
where an empty value or ``none`` means None, ``tuple[int, ...]`` as ``1,2,3``); give
``opt(parse=...)`` for anything else (raise ``ValueError`` with a message).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass, replace
from typing import Any, Protocol, Union, get_args, get_origin, get_type_hints, runtime_checkable

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE  # noqa: PLC0414
from batchfleet.schemas.per_model import PerModel, parse_per_model, split_top_level

#: Prefix of every environment variable.
ENV_PREFIX = "BATCHFLEET_"
_META = "batchfleet"


@dataclass(frozen=True, slots=True)
class Opt:
    """How one settings field is reached from the command line and the environment."""

    help: str
    #: Defaults: ``--field-name`` and ``BATCHFLEET_FIELD_NAME`` (nested: parent's name first).
    flag: str = ""
    env: str = ""
    #: Variables read, in order, when ``env`` is unset (``webhooks``: the broker's URL).
    also_env: tuple[str, ...] = ()
    short: str = ""
    metavar: str = ""
    #: A ``PerModel`` field: ``--flag VALUE`` and repeatable ``--flag MODEL[@VERSION]=VALUE``.
    per_model: bool = False
    #: Repeatable flag; the variable holds the values comma-separated.
    repeat: bool = False
    #: Shown as ``***`` by --print-config (any URL's password is redacted regardless).
    secret: bool = False
    #: Used only with this broker kind; its options are grouped under it in --help.
    transport: str = ""
    #: One string -> the value; default: chosen from the field's type.
    parse: Callable[[str], Any] | None = None
    #: How --help and --print-config show a default that is computed at start-up.
    show: str = ""
    #: The --help panel the option is listed under.
    panel: str = ""
    #: Set by code from other options (the gateway's key ring), never a flag of its own.
    internal: bool = False
    #: A flag only, read from no variable (``bulk run``'s per-job values).
    no_env: bool = False


def opt(help: str, **options: Any) -> dict[str, Opt]:
    """Field metadata: ``field(default=..., metadata=opt("why it exists", ...))``."""
    return {_META: Opt(help, **options)}


def with_opt(declared: Opt, **changes: Any) -> dict[str, Opt]:
    """Field metadata from a shared declaration (``BROKER``), changing what this field
    needs (its parser, panel); the flag, variable and help stay the declared ones."""
    return {_META: replace(declared, **changes)}


def truth(value: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off``: the one boolean parser."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def one_of(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value

    return parse


# --- the connection options every command shares ----------------------------------------

BROKER = Opt(
    "redis://host:port/db (rediss:// with TLS; unix:///path/redis.sock on the same machine), "
    "redis+cluster://host:port[,host:port] (Redis Cluster), kafka://host:port[,host:port], "
    "memory://NAME (in process) or a plugin's scheme.",
    flag="--broker", env="BATCHFLEET_BROKER", metavar="URL")
RESULTS = Opt(
    "Result store, redis://host:port/db (or rediss://, unix://), "
    "redis+cluster://host:port[,host:port] or memory://NAME. Defaults to the broker's URL "
    "when that scheme has a result store.",
    flag="--results",
    env="BATCHFLEET_RESULTS", metavar="URL", show="the broker's URL")
NAMESPACE = Opt("Prefix of every key, stream and topic.", flag="--namespace",
                env="BATCHFLEET_NAMESPACE")
#: ``worker`` and ``models check``: where ``module:factory`` models are imported from.
APP_DIR = Opt("Directory module:factory models are imported from, as uvicorn's --app-dir "
              "(default: the working directory).", flag="--app-dir", env="BATCHFLEET_APP_DIR",
              metavar="DIR")
#: ``webhooks``: RQ's Redis is the result store's (one node), else a Redis broker's.
WEBHOOK_RESULTS = Opt(
    "Redis holding the results and the webhook queue, redis://host:port/db. "
    "Default: BATCHFLEET_RESULTS, else BATCHFLEET_BROKER when it is Redis.",
    flag="--results", env="BATCHFLEET_RESULTS", also_env=("BATCHFLEET_BROKER",),
    metavar="URL")
#: Where callbacks may go (connectors/ssrf.py): the gateway, ``submit`` and ``webhooks``.
CALLBACK_SCHEMES = Opt("Allowed callback URL schemes, comma-separated.",
                       flag="--callback-schemes", env="BATCHFLEET_CALLBACK_SCHEMES")
CALLBACK_HOSTS = Opt(
    "Allowed callback hosts (exact or *.suffix), comma-separated; empty: any public host.",
    flag="--callback-hosts", env="BATCHFLEET_CALLBACK_HOSTS")
CALLBACK_ALLOW_NETS = Opt(
    "Private/loopback networks callbacks may still reach, e.g. 127.0.0.0/8.",
    flag="--callback-allow-nets", env="BATCHFLEET_CALLBACK_ALLOW_NETS")
#: The defaults of the three above.
DEFAULT_CALLBACK_SCHEMES = "https"
#: Webhook delivery (connectors/webhook_jobs.py): ``webhooks worker`` and a plain ``rq worker``.
WEBHOOK_SECRET = Opt("HMAC-SHA256 signing secret (required).", flag="--secret",
                     env="BATCHFLEET_WEBHOOK_SECRET", secret=True)
WEBHOOK_TIMEOUT_S = Opt("Per-delivery HTTP timeout.", flag="--timeout-s",
                        env="BATCHFLEET_WEBHOOK_TIMEOUT_S")
DEFAULT_WEBHOOK_TIMEOUT_S = 10.0


# --- the fields, as options ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettingOption:
    """One leaf field, seen from the command line: its names, parser and default."""

    path: tuple[str, ...]
    opt: Opt
    type: Any
    default: Any
    #: The field's default factory, if it has one (then ``default`` is MISSING).
    factory: Callable[[], Any] | None = None

    @property
    def name(self) -> str:
        """The flat name: ``kafka_partitions``; also the click parameter's name."""
        return "_".join(self.path)

    @property
    def flag(self) -> str:
        return self.opt.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return self.opt.env or ENV_PREFIX + self.name.upper()

    @property
    def envs(self) -> tuple[str, ...]:
        """Every variable read, first one first (none for a ``no_env`` flag)."""
        return () if self.opt.no_env else (self.env, *self.opt.also_env)

    @property
    def required(self) -> bool:
        return self.default is MISSING and self.factory is None and not self.opt.show

    @property
    def repeatable(self) -> bool:
        return self.opt.repeat or self.opt.per_model

    @property
    def is_flag(self) -> bool:
        return self.type is bool

    def get(self, settings: Any) -> Any:
        for part in self.path:
            settings = getattr(settings, part)
        return settings

    def parse(self, raw: str | tuple[str, ...]) -> Any:
        """Values as the command line or the variable gave them -> the field's value.

        Raises ``ConfigError`` naming the flag."""
        try:
            if self.opt.per_model:
                return parse_per_model(raw, self._element_parser(), self.default.default,
                                       self.flag)
            if self.opt.repeat:
                parse_one = self._element_parser()
                return tuple(parse_one(v.strip()) for v in raw if v.strip())
            return self._parser(self.type)(str(raw).strip())
        except ValueError as exc:
            raise ConfigError(f"{self.flag} {raw!r}: {exc}") from exc

    def _element_parser(self) -> Callable[[str], Any]:
        return self.opt.parse or self._parser(get_args(self.type)[0])

    def _parser(self, kind: Any) -> Callable[[str], Any]:
        if self.opt.parse is not None:
            return self.opt.parse
        return type_parser(kind)

    def show_default(self, settings: Any | None = None) -> str:
        """The default as --help shows it (and the README lists it)."""
        if self.opt.show and (self.default is MISSING or self.default is None
                              or self.opt.per_model):
            return self.opt.show
        if self.default is MISSING:
            return ""
        return format_value(self.default)


def _number(kind: type[int] | type[float], raw: str) -> int | float:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"expected {'an integer' if kind is int else 'a number'}") from None


def type_parser(kind: Any) -> Callable[[str], Any]:
    """A string parser for a settings field's type (see the module docstring)."""
    if kind is bool:
        return truth
    if kind is str:
        return str
    if kind in (int, float):
        return lambda raw: _number(kind, raw)
    args = get_args(kind)
    if get_origin(kind) in (Union, types.UnionType) and type(None) in args:
        inner = type_parser(next(a for a in args if a is not type(None)))
        return lambda raw: None if raw.lower() in ("", "none") else inner(raw)
    if get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = type_parser(args[0])
        return lambda raw: tuple(item(v.strip()) for v in split_top_level(raw) if v.strip())
    raise TypeError(f"no parser for settings type {kind!r}: give opt(parse=...)")


@runtime_checkable
class _Located(Protocol):
    """A parsed URL value (``BrokerURL``): written back as its URL."""

    url: str


def format_value(value: Any) -> str:
    """A value as it would be written back on the command line or in the variable."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, PerModel):
        return value.describe(format_value)
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, _Located) and isinstance(value.url, str):
        return value.url
    return str(value)


@functools.cache
def setting_options(cls: type[Any]) -> tuple[SettingOption, ...]:
    """Every leaf field of a settings dataclass that is an option (not ``internal``),
    nested ones flattened, in field order."""
    return tuple(_walk(cls, (), ""))


def _walk(cls: type[Any], prefix: tuple[str, ...], transport: str) -> Iterator[SettingOption]:
    hints = get_type_hints(cls)
    for f in fields(cls):
        meta: Opt | None = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no opt(...) metadata")
        if meta.internal:
            continue
        kind = hints[f.name]
        if _is_settings(kind):
            yield from _walk(kind, (*prefix, f.name), meta.transport)
            continue
        if transport and not meta.transport:
            meta = replace(meta, transport=transport)
        yield SettingOption((*prefix, f.name), meta, kind, f.default, _factory(f))


def _is_settings(kind: Any) -> bool:
    """A nested settings dataclass (every field has an opt), not a value such as BrokerURL."""
    return is_dataclass(kind) and all(_META in f.metadata for f in fields(kind))


def _factory(f: Field[Any]) -> Callable[[], Any] | None:
    return None if f.default_factory is MISSING else f.default_factory


def build(cls: type[Any], values: dict[str, Any], **internal: Any) -> Any:
    """A settings object from parsed flat values (``{"kafka_partitions": 8}``) and its
    ``internal`` fields by name; fields not given keep their defaults."""
    built = _build(cls, (), values)
    return replace(built, **internal) if internal else built


def _build(cls: type[Any], prefix: tuple[str, ...], values: dict[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        path = (*prefix, f.name)
        if _is_settings(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], path, values)
        elif "_".join(path) in values:
            kwargs[f.name] = values["_".join(path)]
    return cls(**kwargs)
