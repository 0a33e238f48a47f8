"""Running a bulk job: claim it, resume from its checkpoint, score, finish, report.

This is the one place the pieces meet: the job's Redis state (lease,
checkpoint, cancel flag), the streaming source, the in-order sink and the
windowed scorer. A run is always a resume: a new job simply resumes from row
0. The checkpoint only ever moves to a position the sink has fsynced, and the
sink truncates back to it on the next run, so a crash at any instant loses no
row and writes none twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from batchfleet.connectors import BrokerURL, ControlPlane, open_control_plane, results_url_for
from batchfleet.connectors.cancelling import cancel_until_done
from batchfleet.connectors.control_plane import StoreResults
from batchfleet.producers.bulk.errors import (
    BulkError,
    EarlyStopError,
    LeaseLostError,
    NotStartedError,
)
from batchfleet.producers.bulk.files import check_files
from batchfleet.producers.bulk.guard import EarlyStop, with_hint
from batchfleet.producers.bulk.progress import NoProgress, ProgressReporter
from batchfleet.producers.bulk.report import JobReport
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sinks import Sink, open_sink
from batchfleet.producers.bulk.sources import Source, open_source
from batchfleet.producers.bulk.spec import JobSpec, Tuning, request_id_for
from batchfleet.producers.bulk.state import LEASE_TTL_S, JobRecord, JobStore
from batchfleet.producers.bulk.watch import WorkerWatch
from batchfleet.producers.bulk.window import Scorer
from batchfleet.producers.client import AsyncClient
from batchfleet.schemas.envelopes import Result
from batchfleet.schemas.errors import BatchfleetError, ConfigError
from batchfleet.schemas.names import DEFAULT_NAMESPACE
from batchfleet.schemas.registry import UnregisteredModelError

log = structlog.get_logger("batchfleet.bulk")
T = TypeVar("T")

#: The SDK's safety poll re-reads every outstanding result this often. Results are
#: announced to the job anyway, and with a whole window outstanding a 1 s poll would
#: cost as many reads as the results themselves; the poll only matters for rows a
#: crashed run had published (their announcements went to the dead client).
RESULT_POLL_S = 5.0


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the fleet is: the same URLs every other command takes."""

    broker: str
    results: str | None = None
    namespace: str = DEFAULT_NAMESPACE

    @property
    def results_url(self) -> str:
        return results_url_for(BrokerURL.parse(self.broker), self.results)


@dataclass(slots=True)
class Context:
    """What one run works with, opened and closed by :func:`run_job`."""

    spec: JobSpec
    record: JobRecord
    source: Source
    jobs: JobStore
    client: AsyncClient
    plane: ControlPlane
    tuning: Tuning
    progress: ProgressReporter

    @property
    def store(self) -> StoreResults:
        return self.plane.results


async def run_job(
    spec: JobSpec, endpoints: Endpoints, *, tuning: Tuning | None = None,
    progress: ProgressReporter | None = None, retry_failed: bool = False,
    restart: bool = False,
) -> JobReport:
    """Run (or resume, or with ``retry_failed`` re-run the failed rows of) one job.

    ``restart`` scores an existing job from scratch: a new epoch of request IDs,
    its files rewritten from row 0, and this spec as its identity.
    """
    tuning = (tuning or Tuning()).validated()
    if restart and retry_failed:
        raise ConfigError("--restart scores every row again; it cannot be combined with "
                          "--retry-failed")
    source = open_source(spec)  # a bad input fails here, before the job is claimed
    for warning in source.warnings:
        log.warning("bulk input looks wrong", job_id=spec.job_id, warning=warning)
    plane = open_control_plane(endpoints.results_url, namespace=endpoints.namespace)
    jobs = JobStore(plane.bulk_jobs, spec.job_id)
    try:
        with not_started():
            record = await jobs.claim(spec, source.total, restart)
        spec = spec.resuming(record.identity)  # a job from before per-job errors files
        if restart:
            from batchfleet.producers.bulk.merge import discard_staging

            discard_staging(spec)  # what an interrupted --retry-failed left beside the files
        todo = None if record.status == "finished" else spec.model
        try:
            async with scoring_session(endpoints, todo, record.position.rows) as (client, plane):
                ctx = Context(spec, record, source, jobs, client, plane, tuning,
                              progress or NoProgress())
                return await holding_lease(jobs, _dispatch(ctx, retry_failed))
        finally:
            await jobs.release()
    finally:
        await plane.close()


@contextlib.asynccontextmanager
async def scoring_session(endpoints: Endpoints, model: str | None = None, saved_rows: int = 0
                          ) -> AsyncIterator[tuple[AsyncClient, ControlPlane]]:
    """The SDK client and control plane one bulk run scores through (a file or a dataset).

    ``model`` (when there is work left) is checked first, before any output file is
    opened: an unknown one fails the run leaving nothing behind."""
    async with contextlib.AsyncExitStack() as stack:
        with not_started(saved_rows):
            client = await stack.enter_async_context(AsyncClient(
                endpoints.broker, endpoints.results, namespace=endpoints.namespace,
                poll_interval_s=RESULT_POLL_S))
            if model is not None:
                await client.ensure_model(model)
        plane = open_control_plane(endpoints.results_url, namespace=endpoints.namespace)
        stack.push_async_callback(plane.close)
        yield client, plane


@contextlib.contextmanager
def not_started(saved_rows: int = 0) -> Iterator[None]:
    """Errors before the first row is scored become :class:`NotStartedError` when the job
    has no saved progress, so no one is told to resume what never began. An unknown
    model is worded for the command line (bulk has no ``check_model`` to turn off)."""
    try:
        yield
    except UnregisteredModelError as exc:
        raise NotStartedError(exc.advice("cli")) from exc
    except BulkError:
        raise  # its own type says what to do (a conflict, a bad input)
    except (BatchfleetError, OSError) as exc:
        if saved_rows:
            raise
        raise NotStartedError(describe(exc) if not str(exc).strip() else str(exc)) from exc


async def _dispatch(ctx: Context, retry_failed: bool) -> JobReport:
    retrying = retry_failed or ctx.record.status == "retrying"  # an interrupted retry goes on
    finished = ctx.record.status in ("finished", "retrying")
    check_files(ctx.spec, ctx.record.position, finished, errors=retrying or not finished)
    if retrying:
        from batchfleet.producers.bulk.retry import retry_failed_rows

        return await retry_failed_rows(ctx)
    if ctx.record.status == "finished":
        log.info("bulk job already finished", job_id=ctx.spec.job_id)
        return report_for(ctx, ctx.record.position, "finished", ctx.record.position, 0.0)
    return await _score_all(ctx)


async def holding_lease(jobs: JobStore, body: Coroutine[Any, Any, T]) -> T:
    """Run ``body`` while refreshing the lease; losing the lease stops it at once."""
    main = asyncio.ensure_future(body)
    keeper = asyncio.create_task(_keep_lease(jobs))
    try:
        await asyncio.wait({main, keeper}, return_when=asyncio.FIRST_COMPLETED)
        if not main.done():
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await main
            keeper.result()  # raises why the lease was lost
        return main.result()
    finally:
        await cancel_until_done([main, keeper])


async def _keep_lease(jobs: JobStore) -> None:
    while True:
        await asyncio.sleep(LEASE_TTL_S / 3)
        await jobs.write()


def report_for(ctx: Context, pos: Position, status: str, start: Position, elapsed_s: float,
               retry_round: int = 0) -> JobReport:
    s = ctx.spec
    return JobReport(s.job_id, s.model, status, str(s.input), str(s.output), str(s.errors),
                     pos.rows, pos.succeeded, pos.failed, pos.rows - start.rows, start.rows,
                     elapsed_s, retry_round, pos.degraded)


class Checkpointer:
    """Fsync what the sink has written, then record that position in Redis."""

    def __init__(self, sink: Sink, jobs: JobStore, start: Position) -> None:
        self.sink, self.jobs, self.saved = sink, jobs, start

    async def __call__(self, force: bool = False) -> bool:
        """Returns whether a cancel was requested."""
        pos = await asyncio.to_thread(self.sink.durable, force)
        if pos is None:
            return await self.jobs.write()
        cancel = await self.jobs.checkpoint(pos)
        self.saved = pos
        return cancel


async def _score_all(ctx: Context) -> JobReport:
    spec, jobs, start = ctx.spec, ctx.jobs, ctx.record.position
    await jobs.write(status="running", cancel=0, error="", started_at=time.time())
    began = time.monotonic()
    ctx.progress.start(spec.job_id, ctx.source.total, start.rows, start.failed)

    async def finished(final: Position) -> None:
        await jobs.checkpoint(final, status="finished", finished_at=time.time(),
                              total=final.rows)

    # Rows a previous run saved count towards the early stop (their errors are not known).
    guard = EarlyStop(ctx.tuning.early_stop_rows, ctx.source.warnings, seen=start.rows,
                      max_rate=ctx.tuning.early_stop_rate, failed=start.failed)
    try:
        completed, final = await score_pass(
            ctx, spec, ctx.source, start, max(ctx.record.published, start.rows),
            guard, worker_watch(ctx), finished)
        if not completed:
            await jobs.write(status="cancelled", finished_at=time.time())
        ctx.progress.update(final.rows, final.failed)
    finally:
        ctx.progress.stop()
    status = "finished" if completed else "cancelled"
    log.info(f"bulk job {status}", job_id=spec.job_id, rows=final.rows, failed=final.failed)
    return report_for(ctx, final, status, start, time.monotonic() - began)


def worker_watch(ctx: Context) -> WorkerWatch:
    return WorkerWatch(ctx.plane.heartbeats.read_all, ctx.spec.job_id,
                       ctx.spec.model, ctx.progress)


async def score_pass(
    ctx: Context, spec: JobSpec, source: Source, start: Position, published: int,
    guard: EarlyStop, watch: WorkerWatch,
    on_complete: Callable[[Position], Awaitable[None]], base: Position | None = None,
) -> tuple[bool, Position]:
    """Score one file from ``start`` into ``spec``'s output, checkpointing as it goes.

    The request IDs are ``spec.job_id``'s (a dataset part has its own). On the
    last row the sink is finished and ``on_complete`` records it; on a cancel the
    last checkpoint is forced. Returns (completed, the durable position). ``base``
    is what earlier parts of a dataset did, added to what progress shows.
    """
    jobs = ctx.jobs
    base = base or Position()
    sink = open_sink(spec, start, source, ctx.tuning)
    checkpoint = Checkpointer(sink, jobs, start)

    async def on_published(hwm: int) -> None:
        nonlocal published
        if hwm > published:
            published = hwm
            await jobs.write(published=hwm)

    async def tick() -> bool:
        now = sink.current()
        ctx.progress.update(base.rows + now.rows, base.failed + now.failed)
        await watch.tick(base.rows + now.rows)
        return not await checkpoint()

    def write(row: Row, result: Result) -> None:
        result = with_hint(result)
        sink.write(row, result)
        guard.see(result)

    epoch = ctx.record.epoch
    scorer = Scorer(ctx.client, ctx.store, spec.model,
                    lambda row: request_id_for(spec.job_id, row, epoch=epoch), ctx.tuning,
                    adopt_below=published, on_published=on_published, version=spec.version)
    scoring = True
    try:
        completed = await scorer.run(source.rows(start), write, tick)
        scoring = False
        if completed:
            final = await asyncio.to_thread(sink.finish)
            await on_complete(final)
            return True, final
        await checkpoint(force=True)
        sink.close()
        return False, checkpoint.saved
    except BaseException as exc:
        await _save_on_the_way_out(checkpoint, exc, scoring)
        raise


async def _save_on_the_way_out(checkpoint: Checkpointer, exc: BaseException,
                               scoring: bool) -> None:
    """Keep the progress a failing run made, and say why it stopped.

    The caller re-raises the original exception whatever happens here; failing
    to save only means the next run starts from the previous checkpoint.
    """
    if isinstance(exc, LeaseLostError):
        checkpoint.sink.close()  # another process owns the job now: touch nothing
        return
    try:
        if scoring and not isinstance(exc, EarlyStopError):  # a rerun must stop again
            await checkpoint(force=True)
        checkpoint.sink.close()
        if isinstance(exc, BatchfleetError | OSError):
            await checkpoint.jobs.write(status="error", error=describe(exc)[:500])
    except (BatchfleetError, OSError, ValueError, asyncio.CancelledError) as save_error:
        # never an empty message: a second Ctrl-C (a CancelledError) has no text of its own
        log.warning("could not save progress while stopping; the next run resumes from the "
                    "checkpoint before", job_id=checkpoint.jobs.job_id,
                    error=describe(save_error), cause=describe(exc))


def describe(exc: BaseException) -> str:
    """An exception as one non-empty line (``KeyboardInterrupt`` and friends have no text)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
