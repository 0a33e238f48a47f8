"""Options and helpers shared by the CLI's command modules."""

from __future__ import annotations

from typing import Annotated

import typer

BrokerOpt = Annotated[str, typer.Option(
    "--broker", envvar="BATCHFLEET_BROKER",
    help="redis://host:port/db or kafka://host:port[,host:port].")]
ResultsOpt = Annotated[str | None, typer.Option(
    "--results", envvar="BATCHFLEET_RESULTS",
    help="Result store, redis://host:port/db. Defaults to the broker's URL when it is Redis.")]
NamespaceOpt = Annotated[str, typer.Option(
    "--namespace", envvar="BATCHFLEET_NAMESPACE", help="Prefix of every key, stream and topic.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


