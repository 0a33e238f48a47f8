"""The ``worker`` command's options, generated from the settings dataclasses.

Each field of :class:`WorkerSettings` and :class:`ProcessSettings` becomes one typer
option (flag, ``BATCHFLEET_*`` variable, help, default shown), so the defaults live
only in ``workers/settings.py``. Every option's own default is None: "not given", so
the dataclass default applies and --print-config can say where each value came from.
Options are strings here and parsed by the settings module, which names the flag in
its errors. This module imports the worker package (and torch), so ``cli.py`` loads it
only when the ``worker`` command runs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from batchfleet.connectors.urls import BrokerURL, parse_url, results_url_for
from batchfleet.schemas.errors import ConfigError
from batchfleet.workers.per_model import PerModel
from batchfleet.workers.settings import (
    ProcessSettings,
    SettingOption,
    WorkerSettings,
    build,
    format_value,
    setting_options,
)

#: Every option of the worker command, in --help order.
OPTIONS: tuple[SettingOption, ...] = (*setting_options(WorkerSettings),
                                      *setting_options(ProcessSettings))
_PROCESS = frozenset(o.name for o in setting_options(ProcessSettings))
#: The metavars typer shows on every other command.
_METAVARS = {int: "<int>", float: "<float>", str: "<str>"}
_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@", re.IGNORECASE)


def _metavar(option: SettingOption) -> str:
    if option.opt.metavar:
        return option.opt.metavar
    base = next((v for t, v in _METAVARS.items() if t is option.type
                 or t in getattr(option.type, "__args__", ())), "<str>")
    return f"[MODEL=]{base}" if option.opt.per_model else base


def _help(option: SettingOption) -> str:
    text = option.opt.help
    if option.opt.per_model:
        text += " Per model: VALUE for every model, or MODEL[@VERSION]=VALUE, repeatable."
    elif option.opt.repeat:
        text += " Repeatable; the variable takes them comma-separated."
    return text


def _panel(option: SettingOption) -> str | None:
    if option.opt.transport:
        return option.opt.transport.capitalize()
    return option.opt.panel or None


def typer_option(option: SettingOption) -> Any:
    """``Annotated[type, typer.Option(...)]`` for one settings field."""
    decls = [f"{option.flag}/--no-{option.flag[2:]}" if option.is_flag else option.flag]
    if option.opt.short:
        decls.append(option.opt.short)
    info = typer.Option(
        *decls, envvar=option.env, show_envvar=True, help=_help(option),
        show_default=option.show_default() or False, rich_help_panel=_panel(option),
        metavar=None if option.is_flag else _metavar(option))
    kind: Any = bool if option.is_flag else list[str] if option.repeatable else str
    return Annotated[kind | None, info]


def worker_function(run: Callable[[typer.Context, dict[str, Any]], None]) -> Callable[..., None]:
    """A function whose signature typer turns into the worker command's options."""
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for option in OPTIONS:
        params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=None, annotation=typer_option(option)))
    params.append(inspect.Parameter(
        "print_config", inspect.Parameter.KEYWORD_ONLY, default=False,
        annotation=Annotated[bool, typer.Option(
            "--print-config", help="Print the effective configuration (secrets redacted), "
                                   "saying where each value came from, and exit.")]))

    def worker(ctx: typer.Context, **values: Any) -> None:
        run(ctx, values)

    worker.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    worker.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return worker


# --- from given values to settings ----------------------------------------------------


def _entries(raw: Any) -> tuple[str, ...]:
    """Repeated flags, or the variable's value split on whitespace: split on commas too."""
    return tuple(part for item in raw for part in str(item).split(","))


def resolve(values: dict[str, Any]) -> tuple[WorkerSettings, ProcessSettings]:
    """Settings from the options that were given (None: not given). Raises ConfigError."""
    parsed: dict[str, Any] = {}
    for option in OPTIONS:
        raw = values.get(option.name)
        if raw is None or (option.repeatable and not raw):
            continue
        if option.is_flag:
            parsed[option.name] = bool(raw)
        else:
            parsed[option.name] = option.parse(_entries(raw) if option.repeatable else raw)
    broker: BrokerURL | None = parsed.get("broker")
    if broker is None:
        raise ConfigError("a broker is needed: pass --broker URL or set BATCHFLEET_BROKER")
    parsed["results_url"] = results_url_for(broker, parsed.get("results_url"))
    if parsed.get("webhook_redis_url"):  # RQ's Redis: one node, as strictly as the others
        parse_url(parsed["webhook_redis_url"], ("redis", "rediss", "unix"), "webhook Redis")
    worker = build(WorkerSettings, {k: v for k, v in parsed.items() if k not in _PROCESS})
    process = build(ProcessSettings, {k: v for k, v in parsed.items() if k in _PROCESS})
    return worker.validated(), process


# --- --print-config ---------------------------------------------------------------------


def redact(option: SettingOption, text: str) -> str:
    if option.opt.secret:
        return "***"
    return _PASSWORD.sub(r"\g<head>***@", text)


def config_lines(worker: WorkerSettings, process: ProcessSettings,
                 source: Callable[[SettingOption], str]) -> Iterator[str]:
    """``name = value  # source`` per option, then ``name[model] = value`` per served model
    for per-model options; what --print-config prints."""
    for option in OPTIONS:
        value = option.get(process if option.name in _PROCESS else worker)
        text, origin = format_value(value), source(option)
        if text and option.opt.show and origin == "default":
            origin += f" ({option.opt.show})"  # a default computed at start-up: say from what
        yield f"{option.name} = {redact(option, text or option.opt.show)}  # {origin}"
        if isinstance(value, PerModel):
            for model in worker.model_names:
                resolved = format_value(value.for_model(model)) or option.opt.show
                yield f"{option.name}[{model}] = {redact(option, resolved)}"


def source_of(ctx: typer.Context) -> Callable[[SettingOption], str]:
    def source(option: SettingOption) -> str:
        found = ctx.get_parameter_source(option.name)
        name = getattr(found, "name", "DEFAULT")
        if name == "COMMANDLINE":
            return f"flag {option.flag}"
        if name == "ENVIRONMENT":
            return f"env {option.env}"
        return "default"
    return source


# --- the README's table -------------------------------------------------------------------

#: The README's configuration table sits between these lines (tests/unit/test_settings.py).
TABLE_START = "<!-- worker-options: generated by `make readme-table` -->"
TABLE_END = "<!-- /worker-options -->"


def config_table() -> str:
    """The README's table of worker options, generated from the settings fields."""
    rows = [TABLE_START, "| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for option in OPTIONS:
        flag = f"`{option.flag}`" + (" (per model)" if option.opt.per_model else "")
        default = option.show_default() or "—"
        cells = (flag, f"`{option.env}`", default, _help(option))
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join([*rows, TABLE_END])


def with_table(readme: str) -> str:
    """``readme`` with its generated table replaced by the current one."""
    head, _, rest = readme.partition(TABLE_START)
    _, found, tail = rest.partition(TABLE_END)
    if not found:
        raise ConfigError(f"README has no {TABLE_START!r} ... {TABLE_END!r} block")
    return head + config_table() + tail

