"""``batchfleet dlq list | show | replay | purge``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from batchfleet.dlq import DeadLetterOps
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail
from connectors.dead_letters import DeadLetter

T = TypeVar("T")

dlq_app = typer.Typer(
    help="Inspect, replay and purge dead-lettered requests (one DLQ per model).",
    no_args_is_help=True, rich_markup_mode="markdown")

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Only this model's DLQ.")]


def _run(broker: str, results: str | None, namespace: str,
         body: Callable[[DeadLetterOps], Awaitable[T]]) -> T:
    async def go() -> T:
        ops = DeadLetterOps(broker, results, namespace)
        try:
            return await body(ops)
        finally:
            await ops.close()

    return asyncio.run(go())


def _as_json(dl: DeadLetter) -> dict[str, object]:
    return {"request_id": dl.request_id, "model": dl.model, "attempts": dl.attempts,
            "reason": dl.reason, "dead_at": dl.dead_at, "errors": dl.errors}


@dlq_app.command("list")
def list_(broker: BrokerOpt, results: ResultsOpt = None, model: ModelOpt = None,
          error_type: Annotated[str | None, typer.Option(help="Only this error type.")] = None,
          namespace: NamespaceOpt = "bf", as_json: JsonOpt = False) -> None:
    """List dead-lettered requests, oldest first.

    Examples:

        batchfleet dlq list --broker redis://localhost:6379/0

        batchfleet dlq list -m demo-mlp --error-type model_error --json
    """
    letters = _run(broker, results, namespace, lambda ops: ops.letters(model, error_type))
    if as_json:
        typer.echo(json.dumps([_as_json(dl) for dl in letters]))
        return
    table = Table(title=f"dead letters ({len(letters)})")
    for col in ("request_id", "model", "attempts", "last error", "dead for"):
        table.add_column(col)
    now = time.time()
    for dl in letters:
        last = dl.errors[-1] if dl.errors else {}
        table.add_row(dl.request_id, dl.model, str(dl.attempts),
                      f"{last.get('type', '')}: {str(last.get('message', ''))[:60]}",
                      f"{now - dl.dead_at:,.0f}s")
    Console().print(table)


@dlq_app.command()
def show(request_id: Annotated[str, typer.Argument(help="The dead-lettered request ID.")],
         broker: BrokerOpt, results: ResultsOpt = None, namespace: NamespaceOpt = "bf") -> None:
    """Show one dead-lettered request with the error of every attempt (JSON).

    Example:

        batchfleet dlq show 3f2a9c... --broker redis://localhost:6379/0
    """
    letters = _run(broker, results, namespace, lambda ops: ops.letters(request_ids=[request_id]))
    if not letters:
        raise fail(f"{request_id} is not in any dead-letter queue", 4)
    typer.echo(json.dumps([_as_json(dl) for dl in letters], indent=2))


@dlq_app.command()
def replay(
    broker: BrokerOpt,
    request_ids: Annotated[list[str] | None, typer.Argument(help="Request IDs to replay.")]
    = None,
    results: ResultsOpt = None, model: ModelOpt = None,
    error_type: Annotated[str | None, typer.Option(help="Only this error type.")] = None,
    replay_all: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
    namespace: NamespaceOpt = "bf",
) -> None:
    """Re-run dead-lettered requests under their own IDs (after fixing the model).

    A replay supersedes the request's `failed` result: it becomes `pending` under
    a new generation, and only the new run's result can land.

    Examples:

        batchfleet dlq replay 3f2a9c... 77b1d0... --broker redis://localhost:6379/0

        batchfleet dlq replay -m demo-mlp --error-type model_error

        batchfleet dlq replay --all
    """
    if not (request_ids or model or error_type or replay_all):
        raise fail("name request IDs, or select with --model / --error-type, or pass --all")

    async def body(ops: DeadLetterOps) -> tuple[int, dict[str, str]]:
        report = await ops.replay(await ops.letters(model, error_type, request_ids or ()))
        return len(report.replayed), report.skipped

    replayed, skipped = _run(broker, results, namespace, body)
    typer.echo(f"replayed {replayed} request(s)")
    for rid, why in skipped.items():
        typer.echo(f"skipped {rid}: {why} (removed from the DLQ)")


@dlq_app.command()
def purge(broker: BrokerOpt, results: ResultsOpt = None, model: ModelOpt = None,
          purge_all: Annotated[bool, typer.Option("--all", help="Every model's DLQ.")] = False,
          yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
          namespace: NamespaceOpt = "bf") -> None:
    """Delete dead letters for good (their `failed` results stay).

    Examples:

        batchfleet dlq purge -m demo-mlp --yes

        batchfleet dlq purge --all --yes
    """
    if not (model or purge_all):
        raise fail("pass --model NAME or --all")
    if not yes:
        typer.confirm(f"Delete the dead letters of {model or 'every model'}?", abort=True)

    async def body(ops: DeadLetterOps) -> int:
        models = [model] if model else await ops.queue.models()
        return sum([await ops.queue.purge(m) for m in models])

    typer.echo(f"purged {_run(broker, results, namespace, body)} dead letter(s)")
