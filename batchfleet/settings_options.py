"""Settings declarations (``schemas/settings.py``) as typer options, for every command.

One :class:`~batchfleet.schemas.settings.SettingOption` becomes one typer option: its
flag, ``BATCHFLEET_*`` variable, help and shown default all come from the declaration.
A generated option's own default is None ("not given"), so the dataclass default applies
and ``--print-config`` can say where each value came from. Values arrive as strings and
are parsed by the declaration, which names the flag in its errors. Also here: the
``--print-config`` lines and the README's generated tables.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any

import typer

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.per_model import PerModel, split_top_level
from batchfleet.schemas.settings import Opt, SettingOption, format_value

#: The metavars typer shows on every other command.
_METAVARS = {int: "<int>", float: "<float>", str: "<str>"}
_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@", re.IGNORECASE)


def _metavar(option: SettingOption) -> str:
    if option.opt.metavar:
        return option.opt.metavar
    base = next((v for t, v in _METAVARS.items() if t is option.type
                 or t in getattr(option.type, "__args__", ())), "<str>")
    return f"[MODEL=]{base}" if option.opt.per_model else base


def help_text(option: SettingOption) -> str:
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


def _envvar(option: SettingOption) -> str | list[str] | None:
    if option.opt.no_env:
        return None
    return list(option.envs) if option.opt.also_env else option.env


def typer_option(option: SettingOption) -> Any:
    """``Annotated[type, typer.Option(...)]`` for one settings field."""
    decls = [f"{option.flag}/--no-{option.flag[2:]}" if option.is_flag else option.flag]
    if option.opt.short:
        decls.append(option.opt.short)
    info = typer.Option(
        *decls, envvar=_envvar(option), show_envvar=not option.opt.no_env,
        help=help_text(option), show_default=option.show_default() or False,
        rich_help_panel=_panel(option),
        metavar=None if option.is_flag else _metavar(option))
    kind: Any = bool if option.is_flag else list[str] if option.repeatable else str
    return Annotated[kind | None, info]


def shared_info(declared: Opt, **extra: Any) -> Any:
    """The ``typer.Option(...)`` for a shared declaration (``BROKER``), to use as
    ``Annotated[str, shared_info(BROKER)]`` in a hand-written command; its default is the
    command's (``= DEFAULT_NAMESPACE``)."""
    envvar = [declared.env, *declared.also_env] if declared.also_env else declared.env
    return typer.Option(declared.flag, envvar=envvar, help=declared.help,
                        metavar=declared.metavar or None, **extra)


def command_function(options: Iterable[SettingOption],
                     run: Callable[[typer.Context, dict[str, Any]], None],
                     name: str, doc: str | None,
                     extra: Iterable[inspect.Parameter] = ()) -> Callable[..., None]:
    """A function whose signature typer turns into one option per declaration, plus
    ``--print-config``; ``run(ctx, values)`` gets the raw values (None: not given).
    ``extra``: hand-written parameters (resolved annotations) listed before them, whose
    values arrive in ``values`` too (``bulk run``'s model, input and connection)."""
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in extra]
    for option in options:
        params.append(inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY,
                                        default=None, annotation=typer_option(option)))
    params.append(inspect.Parameter(
        "print_config", inspect.Parameter.KEYWORD_ONLY, default=False,
        annotation=Annotated[bool, typer.Option(
            "--print-config", help="Print the effective configuration (secrets redacted), "
                                   "saying where each value came from, and exit.")]))

    def command(ctx: typer.Context, **values: Any) -> None:
        run(ctx, values)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command


def _entries(raw: Any) -> tuple[str, ...]:
    """Repeated flags, or the variable's value split on whitespace: split on commas too,
    never inside brackets or quotes (``value:[0.5,0.5]``, ``float32[3,224,224]``)."""
    return tuple(part for item in raw for part in split_top_level(str(item)))


def parse_given(options: Iterable[SettingOption], values: dict[str, Any]) -> dict[str, Any]:
    """The options that were given (None: not given), parsed. Raises ConfigError."""
    parsed: dict[str, Any] = {}
    for option in options:
        raw = values.get(option.name)
        if raw is None or (option.repeatable and not raw):
            continue
        if option.is_flag:
            parsed[option.name] = bool(raw)
        else:
            parsed[option.name] = option.parse(_entries(raw) if option.repeatable else raw)
    return parsed


# --- --print-config ---------------------------------------------------------------------


def redact(option: SettingOption, text: str) -> str:
    if option.opt.secret:
        return "***"
    return _PASSWORD.sub(r"\g<head>***@", text)


def config_lines(options: Iterable[SettingOption], value_of: Callable[[SettingOption], Any],
                 source: Callable[[SettingOption], str],
                 models: Iterable[str] = ()) -> Iterator[str]:
    """``name = value  # source`` per option, then ``name[model] = value`` per model for
    per-model options; what --print-config prints."""
    models = tuple(models)
    for option in options:
        value = value_of(option)
        text, origin = format_value(value), source(option)
        if text and option.opt.show and origin == "default":
            origin += f" ({option.opt.show})"  # a default computed at start-up: say from what
        yield f"{option.name} = {redact(option, text or option.opt.show)}  # {origin}"
        if isinstance(value, PerModel):
            for model in models:
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


# --- the README's tables ------------------------------------------------------------------


def config_table(options: Iterable[SettingOption], start: str, end: str) -> str:
    """A README table of options, generated from their declarations, between markers."""
    rows = [start, "| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for option in options:
        flag = f"`{option.flag}`" + (" (per model)" if option.opt.per_model else "")
        default = option.show_default() or "—"
        cells = (flag, " or ".join(f"`{e}`" for e in option.envs), default, help_text(option))
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join([*rows, end])


def replace_block(readme: str, start: str, end: str, table: str) -> str:
    """``readme`` with the block between ``start`` and ``end`` replaced by ``table``."""
    head, _, rest = readme.partition(start)
    _, found, tail = rest.partition(end)
    if not found:
        raise ConfigError(f"README has no {start!r} ... {end!r} block")
    return head + table + tail
