"""How commands print data: one table/wide/json/yaml switch, full IDs, readable times.

Every command that prints data takes ``-o table|wide|json|yaml`` (``--json`` stays as
an alias for ``-o json``), listings also ``--no-headers``, and hands rows to
:func:`render`. On a terminal, tables fold long cells instead of cutting them, so an ID
copied from a table is the whole ID. Piped or redirected, a table is plain columns: no
box, no title, no colour, and a row is one line however long (``awk '{print $1}'`` gets
whole IDs). Times are local and human in tables, ISO 8601 (UTC) in JSON and YAML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from batchfleet.options import fail

FORMATS = ("table", "wide", "json", "yaml")

OutputOpt = Annotated[str, typer.Option(
    "--output", "-o", metavar="FORMAT",
    help="table, wide (every column), json or yaml.")]
NoHeadersOpt = Annotated[bool, typer.Option(
    "--no-headers", help="Tables without the header row and title (for scripts).")]
#: The width given to a table written to a file or a pipe: so wide that no row folds.
PIPE_WIDTH = 100_000


@dataclass(frozen=True)
class Column:
    """One table column: the row key it shows, its header, and how to show a value."""

    key: str
    header: str = ""
    #: Shown only with ``-o wide``.
    wide: bool = False
    show: Callable[[Any], str] | None = None

    def cell(self, row: Mapping[str, Any]) -> str:
        value = row.get(self.key)
        if self.show is not None:
            return self.show(value)
        return "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def output_format(output: str, as_json: bool = False) -> str:
    """The chosen format, ``--json`` winning; a one-line usage error for an unknown one."""
    if as_json:
        return "json"
    if output not in FORMATS:
        raise fail(f"-o/--output must be one of {', '.join(FORMATS)}, not {output!r}")
    return output


def human_time(ts: float | None) -> str:
    """An epoch time as local wall-clock time with its zone, e.g. 2026-11-23 08:01:02 CET."""
    if not ts:
        return ""
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def iso_time(ts: float | None) -> str | None:
    """An epoch time as ISO 8601 in UTC, for JSON and YAML (None stays None)."""
    if not ts:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat()


def piped() -> bool:
    """Whether stdout is a file or a pipe (plain output) rather than a terminal."""
    return not Console().is_terminal


#: Keys whose numbers are epoch times in the documents commands print (besides ``*_at``).
_TIME_KEYS = frozenset({"at", "last_seen"})


def iso_times(body: Any) -> Any:
    """``body`` with every epoch time (a number under ``*_at``, ``at`` or ``last_seen``)
    as ISO 8601 UTC, at any depth: the README's promise for JSON and YAML output."""
    if isinstance(body, Mapping):
        return {k: iso_time(v) if isinstance(v, int | float) and not isinstance(v, bool)
                and (k in _TIME_KEYS or str(k).endswith("_at")) else iso_times(v)
                for k, v in body.items()}
    if isinstance(body, list | tuple):
        return [iso_times(v) for v in body]
    return body


def console() -> Console:
    """stdout; unbounded and plain when it is a file or a pipe, so only a narrow terminal
    folds cells."""
    out = Console()
    if out.is_terminal:
        return out
    return Console(width=PIPE_WIDTH, no_color=True, highlight=False, emoji=False,
                   soft_wrap=True)


def dump(body: Any, output: str) -> None:
    """One JSON document on one line, or YAML (block style, keys in order)."""
    if output == "yaml":
        try:
            import yaml  # type: ignore[import-untyped]
        except ModuleNotFoundError:
            raise fail("-o yaml needs PyYAML: pip install pyyaml (or use -o json)") from None
        typer.echo(yaml.safe_dump(body, sort_keys=False, allow_unicode=True).rstrip("\n"))
    else:
        typer.echo(json.dumps(body))


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], *,
          wide: bool = False, no_headers: bool = False, title: str | None = None) -> Table:
    """A rich table whose cells fold (never truncate) when the terminal is narrow; plain
    columns, one line a row, when stdout is piped."""
    shown = [c for c in columns if wide or not c.wide]
    plain = piped()
    out = Table(title=None if no_headers or plain else title, show_header=not no_headers,
                box=None if no_headers or plain else box.HEAVY_HEAD,
                header_style="" if plain else "table.header", pad_edge=not plain)
    for column in shown:
        out.add_column(column.header or column.key, overflow="fold", no_wrap=plain)
    for row in rows:
        out.add_row(*(" ".join(column.cell(row).splitlines()) if plain else column.cell(row)
                      for column in shown))
    return out


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], output: str,
           no_headers: bool = False, *, title: str | None = None,
           body: Any = None) -> None:
    """Print ``rows`` as the chosen format; ``body`` (default: ``rows``) is what JSON and
    YAML get, so they can carry every field, not just the table's columns."""
    if output in ("json", "yaml"):
        dump(rows if body is None else body, output)
        return
    console().print(table(rows, columns, wide=output == "wide", no_headers=no_headers,
                          title=title))
