"""``batchfleet webhooks worker | failed | replay``: signed webhook delivery through RQ."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from batchfleet.options import (
    CallbackAllowNetsOpt,
    CallbackHostsOpt,
    CallbackSchemesOpt,
    JsonOpt,
    NamespaceOpt,
    fail,
)
from batchfleet.output import Column, NoHeadersOpt, OutputOpt, output_format, render
from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.names import Names
from batchfleet.schemas.settings import (
    DEFAULT_CALLBACK_SCHEMES,
    DEFAULT_NAMESPACE,
    DEFAULT_WEBHOOK_TIMEOUT_S,
    WEBHOOK_RESULTS,
    WEBHOOK_SECRET,
    WEBHOOK_TIMEOUT_S,
)
from batchfleet.settings_options import shared_info

if TYPE_CHECKING:
    from rq import Queue  # the worker extra: imported where it is used

webhooks_app = typer.Typer(
    help="Deliver signed webhooks (an RQ worker), list failed deliveries and replay them.\n\n"
         "Examples:\n\n    batchfleet webhooks worker\n\n    batchfleet webhooks failed",
    no_args_is_help=True, rich_markup_mode="markdown")

RedisOpt = Annotated[str, shared_info(WEBHOOK_RESULTS)]


def _queue(url: str, namespace: str) -> Queue:
    from batchfleet.connectors.urls import parse_url
    from batchfleet.connectors.webhook_queue import rq_queue

    parse_url(url, ("redis", "rediss", "unix"), "results")  # RQ: one node, no cluster
    return rq_queue(url, Names(namespace))


@webhooks_app.command()
def worker(
    results: RedisOpt,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    secret: Annotated[str, shared_info(WEBHOOK_SECRET, show_default=False)] = "",
    callback_schemes: CallbackSchemesOpt = DEFAULT_CALLBACK_SCHEMES,
    callback_hosts: CallbackHostsOpt = "",
    callback_allow_nets: CallbackAllowNetsOpt = "",
    timeout_s: Annotated[float, shared_info(WEBHOOK_TIMEOUT_S)] = DEFAULT_WEBHOOK_TIMEOUT_S,
    burst: Annotated[bool, typer.Option(help="Exit when the queue is empty.")] = False,
) -> None:
    """Run an RQ worker (with its scheduler, which the retry backoff needs) for webhooks.

    Equivalent to `rq worker --with-scheduler bf-webhooks` with the same BATCHFLEET_*
    environment variables.

    Examples:

        BATCHFLEET_WEBHOOK_SECRET=s3cret batchfleet webhooks worker --results redis://localhost:6379/0
    """
    from batchfleet.connectors.ssrf import CallbackPolicy
    from batchfleet.connectors.webhook_jobs import DeliveryConfig, configure, delivery_worker

    try:
        if not secret:
            raise ConfigError(f"--secret / {WEBHOOK_SECRET.env} is required")
        configure(DeliveryConfig(secret, CallbackPolicy.parse(
            callback_schemes, callback_hosts, callback_allow_nets), timeout_s))
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    queue = _queue(results, namespace)
    delivery_worker(queue, f"webhooks-{os.getpid()}").work(with_scheduler=True, burst=burst)


@webhooks_app.command()
def failed(results: RedisOpt,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, output: OutputOpt = "table",
           no_headers: NoHeadersOpt = False, as_json: JsonOpt = False) -> None:
    """List deliveries that ran out of retries (RQ's failed registry).

    Examples:

        batchfleet webhooks failed --results redis://localhost:6379/0

        batchfleet webhooks failed -o json
    """
    from rq.job import Job

    output_format(output, as_json)  # a bad -o fails before Redis is read
    queue = _queue(results, namespace)
    ids = queue.failed_job_registry.get_job_ids()
    rows = []
    for job in Job.fetch_many(ids, connection=queue.connection):
        if job is None:
            continue
        _, request_id, generation, url = job.args
        latest = job.latest_result()
        trace = ((latest.exc_string or "") if latest is not None else "").strip()
        rows.append({"delivery_id": job.id, "request_id": request_id, "generation": generation,
                     "callback_url": url,
                     "ended_at": job.ended_at.isoformat() if job.ended_at else None,
                     "error": trace.splitlines()[-1] if trace else ""})
    render(rows, COLUMNS, output_format(output, as_json), no_headers,
           title=f"failed deliveries ({len(rows)})")


COLUMNS = (Column("delivery_id", "delivery"), Column("request_id"), Column("callback_url"),
           Column("error"), Column("generation", wide=True), Column("ended_at", wide=True))


@webhooks_app.command()
def replay(
    delivery_ids: Annotated[list[str] | None, typer.Argument(
        help="Delivery IDs to replay (from `webhooks failed`).")] = None,
    results: RedisOpt = "",
    namespace: NamespaceOpt = DEFAULT_NAMESPACE,
    all_: Annotated[bool, typer.Option("--all", help="Replay every failed delivery.")] = False,
) -> None:
    """Put failed deliveries back on the queue with their full retry budget.

    Examples:

        batchfleet webhooks replay --all --results redis://localhost:6379/0

        batchfleet webhooks replay bf-wh-3f2a...-0 --results redis://localhost:6379/0
    """
    from rq.job import Job

    if not results:
        raise fail("--results (or BATCHFLEET_RESULTS) is required")
    queue = _queue(results, namespace)
    registry = queue.failed_job_registry
    ids = registry.get_job_ids() if all_ else list(delivery_ids or [])
    if not ids and not all_:
        raise fail("name delivery IDs, or pass --all")
    replayed = 0
    for job_id in ids:
        try:
            job = Job.fetch(job_id, connection=queue.connection)
        except Exception as exc:  # NoSuchJobError and friends: report, go on with the rest
            typer.echo(f"{job_id}: {exc}", err=True)
            continue
        job.retries_left = int(job.meta.get("retry_max", 0)) or None
        registry.requeue(job)
        replayed += 1
    typer.echo(f"replayed {replayed} of {len(ids)} deliveries")
