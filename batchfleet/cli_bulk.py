"""``batchfleet bulk run | status | cancel | list``: resumable bulk scoring jobs."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import structlog
import typer
from rich.console import Console

from batchfleet.options import BrokerOpt, JsonOpt, NamespaceOpt, ResultsOpt, fail, renamed
from batchfleet.output import (
    Column,
    NoHeadersOpt,
    OutputOpt,
    human_time,
    iso_time,
    output_format,
    render,
)
from batchfleet.producers.bulk.settings import BulkRunSettings
from batchfleet.schemas.settings import DEFAULT_NAMESPACE, SettingOption, build, setting_options
from batchfleet.settings_options import command_function, config_lines, parse_given, source_of

if TYPE_CHECKING:
    from batchfleet.connectors.control_plane import BulkJobStore

T = TypeVar("T")

bulk_app = typer.Typer(
    help="Score files on the fleet (low-priority lane): resumable nightly bulk jobs.\n\n"
         "Examples:\n\n    batchfleet bulk run -m demo-mlp -i rows.jsonl --out scores.jsonl\n\n"
         "    batchfleet bulk list",
    no_args_is_help=True, rich_markup_mode="markdown")

JobIdArg = Annotated[str, typer.Argument(help="The job ID `bulk run` printed.")]


def _configure_logging(fmt: str, level: str) -> None:
    """JSON log lines, or a console on a TTY (as ``batchfleet worker``; torch-free import)."""
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.dev.ConsoleRenderer() if console
                    else structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


def _jobs_call(broker: str, results: str | None, namespace: str,
               body: Callable[[BulkJobStore], Awaitable[T]]) -> T:
    from batchfleet.options import open_doors

    async def go() -> T:
        plane, _ = open_doors(broker, results, namespace)
        try:
            return await body(plane.bulk_jobs)
        finally:
            await plane.close()

    return asyncio.run(go())


def _run_args(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, as workers serve it.")],
    input: Annotated[str, typer.Option(
        "--input", "-i", help=".jsonl, .parquet or .npy file; or a dataset of Parquet or "
                              "JSONL parts: a directory, a glob, or s3://bucket/prefix.")],
    broker: BrokerOpt,
    out: Annotated[str | None, typer.Option(
        "--out", metavar="PATH",
        help="Output file, same format family as the input; for a dataset, a directory or "
             "s3://bucket/prefix (one part per input part). Required.")] = None,
    results: ResultsOpt = None,
    old_output: Annotated[str | None, typer.Option(
        "--output", "-o", hidden=True, help="Deprecated spelling of --out.")] = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    log_format: Annotated[str, typer.Option(envvar="BATCHFLEET_LOG_FORMAT",
                                            help="auto, json or console.")] = "auto",
    log_level: Annotated[str, typer.Option(
        envvar="BATCHFLEET_LOG_LEVEL",
        help="debug, info, warning, error or critical.")] = "info",
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the final report as JSON instead of a table.")] = False,
) -> None:
    """Score a file, or a dataset of parts, through the fleet, resumably; print a summary.

    Rows go on the low-priority `bulk` lane with at most `--window` in flight.
    The output keeps `custom_id` (or the row index), `status` and `outputs`, in
    input order; failed rows also go to the errors file. A dataset (a
    directory, a glob or an `s3://` prefix of Parquet or JSONL parts) gets one
    output part per input part, each appearing only once complete; `--shard
    K/N` splits the parts between runners. Exit code: 0 done, 1
    more failures than `--max-failure-rate` (or the first rows all failed the
    same way), 2 bad usage or input, or an output the job's state counts on is
    missing, 3 cancelled, 4 the job ID is busy or belongs to another input, 130
    interrupted (Ctrl-C), 143 stopped by SIGTERM (both save progress first).

    Examples:

        batchfleet bulk run -m demo-mlp -i rows.jsonl --out scores.jsonl --broker redis://localhost:6379/0

        batchfleet bulk run -m demo-mlp -i rows.jsonl --out scores.jsonl --job-id nightly-20250101

        batchfleet bulk run -m demo-mlp -i x.parquet --out y.parquet --feature-columns f0,f1,f2

        batchfleet bulk run -m demo-mlp -i x.npy --out y.npy --job-id nightly-1 --retry-failed

        batchfleet bulk run -m demo-mlp -i s3://data/in --out s3://data/out --job-id n1 --shard 1/4

        batchfleet bulk run -m demo-mlp -i 'parts/*.jsonl' --out scored/ --job-id n1
    """


#: ``bulk run``'s plain-value options, generated from their declarations.
RUN_OPTIONS: tuple[SettingOption, ...] = setting_options(BulkRunSettings)


def _run(ctx: typer.Context, values: dict[str, Any]) -> None:
    from batchfleet.producers.bulk import (
        BarProgress,
        BulkError,
        EarlyStopError,
        Endpoints,
        InputFormatError,
        JobConflictError,
        LogProgress,
        NoProgress,
        NotStartedError,
        OutputMissingError,
        ProgressReporter,
        Tuning,
        exit_code,
        new_job_id,
        summary_table,
    )
    from batchfleet.producers.bulk.job import describe
    from batchfleet.producers.bulk.stopping import Stopped, run_stoppable
    from batchfleet.schemas.errors import BatchfleetError, ConfigError

    s = _run_settings(ctx, values)
    output = renamed("--out", values["out"], "--output/-o", values["old_output"])
    if output is None:
        raise fail("--out PATH is required (where the scored rows go)")
    _configure_logging(values["log_format"], values["log_level"])
    job_id = s.job_id or new_job_id()
    features = tuple(c.strip() for c in (s.feature_columns or "").split(",") if c.strip())
    reporters: dict[str, Callable[[], ProgressReporter]] = {
        "bar": BarProgress, "log": LogProgress, "none": NoProgress}
    progress = s.progress
    if progress == "auto":
        progress = "bar" if sys.stderr.isatty() else "log"
    if progress not in reporters:
        raise fail(f"--progress must be auto, bar, log or none, not {progress!r}")
    endpoints = Endpoints(values["broker"], values["results"], values["namespace"])
    try:
        tuning = Tuning(window=s.window, stall_s=s.stall_s, part_rows=s.part_rows,
                        early_stop_rows=s.early_stop_rows,
                        early_stop_rate=s.early_stop_rate, degrade=s.degrade).validated()
        if s.restart and s.retry_failed:
            raise ConfigError("--restart and --retry-failed cannot be combined")
        options: dict[str, Any] = {
            "dtype": s.dtype, "input_column": s.input_column, "feature_columns": features,
            "id_column": s.id_column, "max_line_bytes": s.max_line_bytes, "version": s.version}
        _ = endpoints.results_url  # a malformed --broker/--results: one line, exit 2
        main = _job_main(job_id, values["model"], values["input"], output, _path(s.errors),
                         s.shard, s.s3_endpoint,
                         _path(s.staging_dir), options, endpoints, tuning, reporters[progress](),
                         s.retry_failed, s.restart)
    except (ConfigError, InputFormatError) as exc:
        raise fail(str(exc)) from exc
    typer.secho(f"bulk job {job_id}", err=True)
    try:  # SIGTERM (Kubernetes) stops it as Ctrl-C does: checkpoint, cursor back
        report = run_stoppable(main)
    except KeyboardInterrupt:
        raise fail(f"interrupted; progress is saved: resume with --job-id {job_id}",
                   130) from None
    except Stopped as exc:
        raise fail(f"stopped by {exc}; progress is saved: resume with --job-id {job_id}",
                   exc.exit_code) from None
    except JobConflictError as exc:
        raise fail(str(exc), 4) from exc
    except NotStartedError as exc:  # nothing saved, so nothing to resume
        raise fail(str(exc), 1) from exc
    except (InputFormatError, OutputMissingError) as exc:
        raise fail(str(exc)) from exc
    except EarlyStopError as exc:
        raise fail(str(exc), 1) from exc
    except (BulkError, BatchfleetError, OSError) as exc:
        raise fail(f"{str(exc) or describe(exc)} (progress is saved: resume with --job-id "
                   f"{job_id})", 1) from exc
    if values["as_json"]:
        typer.echo(json.dumps(report.to_dict()))
    else:
        Console().print(summary_table(report, s.max_failure_rate))
    raise typer.Exit(exit_code(report, s.max_failure_rate))


bulk_app.command("run")(command_function(
    RUN_OPTIONS, _run, "run", _run_args.__doc__,
    extra=inspect.signature(_run_args, eval_str=True).parameters.values()))


def _run_settings(ctx: typer.Context, values: dict[str, Any]) -> BulkRunSettings:
    """The declared options that were given, over their defaults; ``--print-config``
    prints them, saying where each came from, and exits."""
    from batchfleet.schemas.errors import ConfigError

    try:
        settings: BulkRunSettings = build(BulkRunSettings, parse_given(RUN_OPTIONS, values))
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if values.get("print_config"):
        def value_of(option: SettingOption) -> Any:
            return option.get(settings)

        for line in config_lines(RUN_OPTIONS, value_of, source_of(ctx)):
            typer.echo(line)
        raise typer.Exit(0)
    return settings


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def _job_main(job_id: str, model: str, input: str, output: str, errors: Path | None,
              shard: str | None, s3_endpoint: str | None, staging_dir: Path | None,
              options: dict[str, Any], endpoints: Any, tuning: Any, progress: Any,
              retry_failed: bool, restart: bool) -> Coroutine[Any, Any, Any]:
    """The run to make: one file (``run_job``) or this runner's parts of a dataset."""
    import os

    from batchfleet.producers.bulk import JobSpec, run_job
    from batchfleet.producers.bulk.dataset import (
        DatasetSpec,
        Shard,
        check_dataset_flags,
        is_dataset,
    )
    from batchfleet.producers.bulk.storage import S3Options, is_remote
    from batchfleet.schemas.errors import ConfigError

    if is_dataset(input) or is_remote(output):
        from batchfleet.producers.bulk.dataset_job import run_dataset  # pyarrow: bulk extra

        check_dataset_flags(input, errors, retry_failed)
        job = DatasetSpec.create(job_id, model, input, output, shard=Shard.parse(shard),
                                 s3=S3Options.from_env(os.environ, s3_endpoint),
                                 staging=staging_dir, **options)  # AWS_* read here, once
        return run_dataset(job, endpoints, tuning=tuning, progress=progress, restart=restart)
    if shard is not None:
        raise ConfigError(f"--shard splits a dataset's parts between runners; the input "
                          f"{input} is one file")
    spec = JobSpec.create(job_id, model, Path(input), Path(output), errors, **options)
    return run_job(spec, endpoints, tuning=tuning, progress=progress,
                   retry_failed=retry_failed, restart=restart)


def _record_json(record: Any) -> dict[str, Any]:
    return {"job_id": record.job_id, "status": record.display_status,
            "model": record.identity.get("model"), "input": record.identity.get("input"),
            "output": record.identity.get("output"), "errors": record.identity.get("errors"),
            "rows_done": record.rows_done, "total": record.total,
            "succeeded": record.succeeded, "failed": record.failed,
            "retry_round": record.retry_round, "epoch": record.epoch,
            **({"shard": record.identity["shard"], "parts": record.identity.get("parts"),
                "parts_done": record.dataset.parts} if "shard" in record.identity else {}),
            "created_at": iso_time(record.created_at), "updated_at": iso_time(record.updated_at),
            "finished_at": iso_time(record.finished_at), "running_on": record.owner,
            "cancel_requested": record.cancel_requested, "error": record.error or None}


def _record_row(record: Any) -> dict[str, Any]:
    total = f" / {record.total:,}" if record.total else ""
    return {**_record_json(record), "rows": f"{record.rows_done:,}{total}",
            "created_at": human_time(record.created_at),
            "updated_at": human_time(record.updated_at),
            "finished_at": human_time(record.finished_at)}


COLUMNS = (Column("job_id"), Column("status"), Column("model"),
           Column("rows", "rows done"), Column("failed"), Column("updated_at", "updated"),
           Column("input", wide=True), Column("output", wide=True),
           Column("running_on", "running on", wide=True))
FIELD_COLUMNS = (Column("field"), Column("value"))


@bulk_app.command()
def status(job_id: JobIdArg, broker: BrokerOpt, results: ResultsOpt = None,
           namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "table",
           no_headers: NoHeadersOpt = False, as_json: JsonOpt = False) -> None:
    """Show one job: status, rows done, failures, files. Exit 4 if unknown.

    Status is running, retrying, finished, cancelled, error, or interrupted
    (its process died: run it again with the same job ID to resume). A job
    run with `--shard K/N` shows its shards added up (and each shard's own
    status); `not started` while a shard has never run.

    Examples:

        batchfleet bulk status nightly-20250101 --broker redis://localhost:6379/0

        batchfleet bulk status nightly-20250101 -o json
    """
    from batchfleet.producers.bulk import load_job
    from batchfleet.producers.bulk.shards import ShardedJob, load_sharded

    fmt = output_format(output, as_json)

    async def find(jobs: BulkJobStore) -> Any:
        return await load_job(jobs, job_id) or await load_sharded(jobs, job_id)

    record = _jobs_call(broker, results, namespace, find)
    if record is None:
        raise fail(f"no bulk job {job_id} (never run, or its record expired)", 4)
    if isinstance(record, ShardedJob):
        _render_sharded(record, fmt, no_headers)
        return
    row = _record_row(record)
    rows = [{"field": key, "value": value} for key, value in row.items()
            if value not in (None, "") and key not in ("job_id", "rows")]
    render(rows, FIELD_COLUMNS, fmt, no_headers, title=f"bulk job {job_id}",
           body=_record_json(record))


def _render_sharded(job: Any, fmt: str, no_headers: bool) -> None:
    body = job.to_dict()
    total = f" / {job.total:,}" if job.total is not None else ""
    rows = [{"field": key, "value": value} for key, value in body.items()
            if value not in (None, "") and key not in ("job_id", "rows_done", "total")]
    rows.insert(1, {"field": "rows", "value": f"{body['rows_done']:,}{total}"})
    for number in range(1, job.shards + 1):
        record = job.records.get(number)
        rows.append({"field": f"shard {number}/{job.shards}", "value": "not started"
                     if record is None else f"{record.display_status}, "
                     f"{record.rows_done:,} rows, {record.failed:,} failed"})
    body["shard_records"] = {str(n): _record_json(r) for n, r in job.records.items()}
    render(rows, FIELD_COLUMNS, fmt, no_headers, title=f"bulk job {job.job_id} "
           f"({job.shards} shards)", body=body)


@bulk_app.command()
def cancel(job_id: JobIdArg, broker: BrokerOpt, results: ResultsOpt = None,
           namespace: NamespaceOpt = DEFAULT_NAMESPACE) -> None:
    """Stop a job at its next checkpoint (within a second); it can be resumed later.

    A job run with `--shard K/N` is cancelled in every shard that has started.

    Examples:

        batchfleet bulk cancel nightly-20250101 --broker redis://localhost:6379/0
    """
    from batchfleet.producers.bulk import request_cancel
    from batchfleet.producers.bulk.shards import load_sharded

    async def cancel_all(jobs: BulkJobStore) -> list[tuple[str, Any]]:
        record = await request_cancel(jobs, job_id)
        if record is not None:
            return [(job_id, record)]
        sharded = await load_sharded(jobs, job_id)
        ids = [r.job_id for r in sharded.records.values()] if sharded else []
        return [(i, await request_cancel(jobs, i)) for i in ids]

    records = _jobs_call(broker, results, namespace, cancel_all)
    if not records:
        raise fail(f"no bulk job {job_id}", 4)
    for name, record in records:
        if record is None:
            typer.echo(f"{name} is gone (its record expired)")
        elif record.live:
            typer.echo(f"cancel requested: {name} stops at its next checkpoint")
        else:
            typer.echo(f"{name} is not running; it is now {record.display_status}")


@bulk_app.command("list")
def list_(broker: BrokerOpt, results: ResultsOpt = None,
          namespace: NamespaceOpt = DEFAULT_NAMESPACE,
          limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
          output: OutputOpt = "table", no_headers: NoHeadersOpt = False,
          as_json: JsonOpt = False) -> None:
    """List bulk jobs, newest first, with their whole job IDs.

    Examples:

        batchfleet bulk list --broker redis://localhost:6379/0

        batchfleet bulk list --limit 10 -o json

        batchfleet bulk list -o wide --no-headers
    """
    from batchfleet.producers.bulk import list_jobs

    fmt = output_format(output, as_json)
    records = _jobs_call(broker, results, namespace, lambda jobs: list_jobs(jobs, limit))
    render([_record_row(r) for r in records], COLUMNS, fmt, no_headers,
           title=f"bulk jobs ({len(records)})", body=[_record_json(r) for r in records])
