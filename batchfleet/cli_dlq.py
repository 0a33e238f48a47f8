"""``batchfleet dlq list | show | replay | purge``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from batchfleet.connectors.values import DeadLetter
from batchfleet.dlq import DeadLetterOps, ReplayReport, Selection
from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail
from batchfleet.output import (
    Column,
    NoHeadersOpt,
    OutputOpt,
    dump,
    human_time,
    iso_time,
    output_format,
    render,
)
from batchfleet.schemas.settings import DEFAULT_NAMESPACE

T = TypeVar("T")

dlq_app = typer.Typer(
    help="Inspect, replay and purge dead-lettered requests (one DLQ per model).\n\n"
         "Examples:\n\n    batchfleet dlq list\n\n    batchfleet dlq replay --all --dry-run",
    no_args_is_help=True, rich_markup_mode="markdown")

ModelOpt = Annotated[list[str] | None, typer.Option(
    "--model", "-m", help="Only these models' DLQs (repeatable).")]
ModelArgs = Annotated[list[str] | None, typer.Argument(
    metavar="MODEL", help="Only these models' DLQs (the same as -m).", show_default=False)]


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
    """A letter for JSON and YAML: every time ISO 8601 UTC, the attempts' too."""
    errors = [{**e, "at": iso_time(e["at"])} if isinstance(e.get("at"), int | float) else e
              for e in dl.errors]
    return {"request_id": dl.request_id, "model": dl.model, "attempts": dl.attempts,
            "reason": dl.reason, "dead_at": iso_time(dl.dead_at), "errors": errors}


async def _selected(ops: DeadLetterOps, models: list[str], error_type: str | None
                    ) -> list[DeadLetter]:
    """The letters of ``models`` (every model when empty); a model with no dead-letter
    queue is one warning on stderr, not an empty answer that looks like a clean one."""
    if not models:
        return await ops.letters(None, error_type)
    known = set(await ops.queue.models())
    for model in models:
        if model not in known:
            typer.secho(f"warning: no dead-letter queue for model {model!r} (queues: "
                        f"{', '.join(sorted(known)) or 'none'})", err=True)
    return [dl for model in dict.fromkeys(models) if model in known
            for dl in await ops.letters(model, error_type)]


def _row(dl: DeadLetter) -> dict[str, object]:
    last = dl.errors[-1] if dl.errors else {}
    return {**_as_json(dl), "dead_at": human_time(dl.dead_at),
            "last_error": f"{last.get('type', '')}: {last.get('message', '')}",
            "dead_for": f"{time.time() - dl.dead_at:,.0f}s"}


COLUMNS = (Column("request_id"), Column("model"), Column("attempts"),
           Column("last_error", "last error"), Column("dead_for", "dead for"),
           Column("reason", wide=True), Column("dead_at", "dead at", wide=True))


@dlq_app.command("list")
def list_(broker: BrokerOpt, models: ModelArgs = None, results: ResultsOpt = None,
          model: ModelOpt = None,
          error_type: Annotated[str | None, typer.Option(help="Only this error type.")] = None,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "table",
          no_headers: NoHeadersOpt = False, as_json: JsonOpt = False) -> None:
    """List dead-lettered requests, oldest first: every one, once per request ID and
    generation (paged, no cap). IDs are printed whole, ready for `dlq show`.

    Examples:

        batchfleet dlq list --broker redis://localhost:6379/0

        batchfleet dlq list demo-mlp

        batchfleet dlq list -m demo-mlp -m demo-encoder --error-type model_error -o json

        batchfleet dlq list -o wide --no-headers | awk '{print $1}'
    """
    fmt = output_format(output, as_json)
    wanted = [*(models or ()), *(model or ())]
    letters = _run(broker, results, namespace, lambda ops: _selected(ops, wanted, error_type))
    render([_row(dl) for dl in letters], COLUMNS, fmt, no_headers,
           title=f"dead letters ({len(letters)})", body=[_as_json(dl) for dl in letters])


ATTEMPT_COLUMNS = (Column("attempt"), Column("type"), Column("message"), Column("at"),
                   Column("retryable", wide=True))


@dlq_app.command()
def show(request_id: Annotated[str, typer.Argument(help="The dead-lettered request ID.")],
         broker: BrokerOpt, results: ResultsOpt = None, namespace: NamespaceOpt = DEFAULT_NAMESPACE,
         output: OutputOpt = "table", no_headers: NoHeadersOpt = False,
         as_json: JsonOpt = False) -> None:
    """Show one dead-lettered request and the error of every attempt. Exit 4 if it is not
    in any dead-letter queue.

    Examples:

        batchfleet dlq show 3f2a9c... --broker redis://localhost:6379/0

        batchfleet dlq show 3f2a9c... -o json
    """
    fmt = output_format(output, as_json)
    letters = _run(broker, results, namespace, lambda ops: ops.letters(request_ids=[request_id]))
    if not letters:
        raise fail(f"{request_id} is not in any dead-letter queue", 4)
    if fmt in ("json", "yaml"):
        dump([_as_json(dl) for dl in letters], fmt)
        return
    for dl in letters:
        rows = [{"attempt": n, "type": e.get("type", ""), "message": e.get("message", ""),
                 "at": _attempt_time(e.get("at")), "retryable": str(e.get("retryable", ""))}
                for n, e in enumerate(dl.errors, 1)]
        title = (f"{dl.request_id}  model {dl.model}  {dl.attempts} attempt(s)  "
                 f"{dl.reason}  dead since {human_time(dl.dead_at)}")
        render(rows, ATTEMPT_COLUMNS, fmt, no_headers, title=title)


def _attempt_time(value: object) -> str:
    return human_time(value) if isinstance(value, int | float) else str(value or "")


@dlq_app.command()
def replay(
    broker: BrokerOpt,
    request_ids: Annotated[list[str] | None, typer.Argument(help="Request IDs to replay.")]
    = None,
    results: ResultsOpt = None, model: ModelOpt = None,
    error_type: Annotated[str | None, typer.Option(help="Only this error type.")] = None,
    replay_all: Annotated[bool, typer.Option("--all", help="Replay every dead letter.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only list what would be replayed or skipped; change nothing.")]
    = False,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
) -> None:
    """Re-run dead-lettered requests under their own IDs (after fixing the model).

    A replay supersedes the request's `failed` result: it becomes `pending` under
    a new generation, and only the new run's result can land.

    Examples:

        batchfleet dlq replay 3f2a9c... 77b1d0... --broker redis://localhost:6379/0

        batchfleet dlq replay -m demo-mlp --error-type model_error

        batchfleet dlq replay --all --dry-run
    """
    if not (request_ids or model or error_type or replay_all):
        raise fail("name request IDs, or select with --model / --error-type, or pass --all")

    selections = [Selection(m, error_type, tuple(request_ids or ())) for m in _or_all(model)]
    if dry_run:
        plan = _run(broker, results, namespace, lambda ops: _each(ops.replay_plan, selections))
        for rid in plan.replayed:
            typer.echo(f"would replay {rid}")
        for rid, why in plan.skipped.items():
            typer.echo(f"would skip {rid}: {why}")
        typer.echo(f"would replay {len(plan.replayed)} request(s), skip "
                   f"{len(plan.skipped)} (dry run: nothing changed)")
        return
    report = _run(broker, results, namespace,
                  lambda ops: _each(ops.replay_selected, selections))
    typer.echo(f"replayed {len(report.replayed)} request(s)")
    for rid, why in report.skipped.items():
        typer.echo(f"skipped {rid}: {why} (removed from the DLQ)")


def _or_all(models: list[str] | None) -> list[str | None]:
    """The models named, or ``[None]``: every model."""
    return [*models] if models else [None]


async def _each(run: Callable[[Selection], Awaitable[ReplayReport]],
                selections: list[Selection]) -> ReplayReport:
    """One report over several models' selections, run one after another."""
    report = ReplayReport()
    for selection in selections:
        part = await run(selection)
        report.replayed += part.replayed
        report.skipped.update(part.skipped)
    return report


@dlq_app.command()
def purge(broker: BrokerOpt, results: ResultsOpt = None, model: ModelOpt = None,
          purge_all: Annotated[bool, typer.Option("--all", help="Every model's DLQ.")] = False,
          yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Delete dead letters for good (their `failed` results stay).

    Examples:

        batchfleet dlq purge -m demo-mlp --yes

        batchfleet dlq purge --all --yes
    """
    if not (model or purge_all):
        raise fail("pass --model NAME or --all")
    if not yes:
        typer.confirm(f"Delete the dead letters of {', '.join(model or ['every model'])}?",
                      abort=True)

    async def go(ops: DeadLetterOps) -> int:
        return sum([await ops.purge(m) for m in _or_all(model)])

    typer.echo(f"purged {_run(broker, results, namespace, go)} dead letter(s)")
