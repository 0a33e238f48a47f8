"""Running one runner's share of a dataset: part after part, each scored, then published.

Each part is scored exactly as a single file is (``job.score_pass``: the same
window, in-order sink, early stop and checkpoints), into a staging folder, and
then *published*: moved (local) or uploaded (S3) to its final name, so an
output part only ever appears complete (``storage.publish``). The runner's job
record holds the finished parts (``DatasetProgress``) and the checkpoint
within the current part, so a killed runner resumes mid-part:

1. scoring: the staging files are truncated back to the checkpoint and the
   part goes on (if the staging folder is gone, say the runner moved to
   another host, the part starts again from its first row; its rows that
   were published are read back from the result store, not computed again);
2. ``ds_phase = publish``: the part's files are complete in staging, so the
   run publishes them again (publishing is idempotent) and moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from batchfleet.connectors import open_control_plane
from batchfleet.producers.bulk.dataset import DEFAULT_STAGING, DatasetSpec, Part
from batchfleet.producers.bulk.errors import InputFormatError, OutputMissingError
from batchfleet.producers.bulk.files import check_files
from batchfleet.producers.bulk.guard import EarlyStop
from batchfleet.producers.bulk.job import (
    Context,
    Endpoints,
    holding_lease,
    not_started,
    score_pass,
    scoring_session,
    worker_watch,
)
from batchfleet.producers.bulk.progress import NoProgress, ProgressReporter
from batchfleet.producers.bulk.report import JobReport
from batchfleet.producers.bulk.rows import Position
from batchfleet.producers.bulk.sources import JsonlSource, Source, open_source
from batchfleet.producers.bulk.spec import JobSpec, Tuning
from batchfleet.producers.bulk.state import JOB_TTL_S, DatasetProgress, JobRecord, JobStore
from batchfleet.producers.bulk.storage import exists, open_read, publish, remove
from batchfleet.producers.client import AsyncClient

log = structlog.get_logger("batchfleet.bulk")


def open_part(spec: DatasetSpec, part: Part, pspec: JobSpec) -> tuple[Source, Callable[[], None]]:
    """The part's source, and how to close what it holds open (a remote Parquet file)."""
    location = part.file.location
    try:
        if not location.remote:
            return open_source(pspec), lambda: None
        if spec.format == "jsonl":
            return JsonlSource(pspec.input, pspec.dtype, pspec.id_column, pspec.max_line_bytes,
                               opener=lambda: open_read(location)), lambda: None
        from batchfleet.producers.bulk.source_parquet import ParquetSource

        file = location.fs.open_input_file(location.path)
        try:
            return ParquetSource(pspec, file=file), file.close
        except BaseException:
            file.close()
            raise
    except InputFormatError as exc:
        if location.url in str(exc):
            raise
        raise InputFormatError(f"part {location.url}: {exc}") from None
    except OSError as exc:
        raise InputFormatError(f"cannot read part {location.url}: {exc}") from None


def shard_total(spec: DatasetSpec) -> int | None:
    """Rows in this runner's parts, when every part's count is cheap to know. Opening
    each part here also means a bad part fails the run before the job is claimed."""
    totals: list[int | None] = []
    for part in spec.mine:
        source, close = open_part(spec, part, spec.part_spec(part))
        try:
            totals.append(source.total)
            for warning in source.warnings:
                log.warning("bulk input looks wrong", job_id=spec.record_id, part=part.name,
                            warning=warning)
        finally:
            close()
    return None if None in totals else sum(t or 0 for t in totals)


def publish_part(spec: DatasetSpec, part: Part, pspec: JobSpec) -> bool:
    """Errors file, then output, to their final names; False when neither the staged
    output nor a published one is there (the part must be scored again)."""
    out, err = spec.output_of(part), spec.errors_of(part)
    if pspec.errors.exists():
        if pspec.errors.stat().st_size:
            publish(pspec.errors, err, spec.tmp_of(part, err))
        else:
            remove(err)  # a stale one from an earlier epoch
    if pspec.output.exists():
        publish(pspec.output, out, spec.tmp_of(part, out))
    elif not exists(out):
        return False
    shutil.rmtree(pspec.output.parent, ignore_errors=True)
    return True


def resume_point(pspec: JobSpec, start: Position, part: Part) -> Position:
    """``start``, or row 0 when the staging files it counts on are gone."""
    try:
        check_files(pspec, start, finished=False)
        return start
    except OutputMissingError as exc:
        log.warning("staged files of the part are gone; scoring the part from its first "
                    "row (rows already published are read back from the result store)",
                    part=part.name, reason=str(exc))
        return Position()


def _check_published(spec: DatasetSpec, parts: tuple[Part, ...]) -> None:
    for part in parts:
        if not exists(spec.output_of(part)):
            raise OutputMissingError(
                f"output {spec.output_of(part).url} is missing but the job state says part "
                f"{part.name} is done: run again with --restart to score from scratch, or "
                "restore it")


@dataclass(slots=True)
class _Run:
    spec: DatasetSpec
    record: JobRecord
    jobs: JobStore
    client: AsyncClient
    plane: Any
    tuning: Tuning
    progress: ProgressReporter

    def context(self, pspec: JobSpec, source: Source) -> Context:
        return Context(pspec, self.record, source, self.jobs, self.client, self.plane,
                       self.tuning, self.progress)


async def run_dataset(spec: DatasetSpec, endpoints: Endpoints, *, tuning: Tuning | None = None,
                      progress: ProgressReporter | None = None, restart: bool = False
                      ) -> JobReport:
    """Run (or resume) this runner's parts of a dataset job (``spec.shard``)."""
    tuning = (tuning or Tuning()).validated()
    total = await asyncio.to_thread(shard_total, spec)
    plane = open_control_plane(endpoints.results_url, namespace=endpoints.namespace)
    bulk_jobs = plane.bulk_jobs
    jobs = JobStore(bulk_jobs, spec.record_id)
    try:
        with not_started():
            record = await jobs.claim(spec, total, restart)
        if spec.shard.of > 1:
            await bulk_jobs.index_shard(spec.job_id, spec.record_id, time.time(), JOB_TTL_S)
        if restart:
            shutil.rmtree(spec.staging, ignore_errors=True)
        todo = None if record.status == "finished" else spec.model
        try:
            async with scoring_session(endpoints, todo, record.rows_done) as (client, plane_):
                run = _Run(spec, record, jobs, client, plane_, tuning, progress or NoProgress())
                return await holding_lease(jobs, _score_parts(run, total))
        finally:
            await jobs.release()
    finally:
        await plane.close()


async def _score_parts(run: _Run, total: int | None) -> JobReport:
    spec, record, jobs = run.spec, run.record, run.jobs
    mine = spec.mine
    done, start, published = record.dataset, record.position, record.published
    began, resumed_from = time.monotonic(), record.rows_done
    if record.status == "finished":
        await asyncio.to_thread(_check_published, spec, mine)
        log.info("bulk job already finished", job_id=spec.record_id)
        return _report(spec, done, "finished", resumed_from, 0.0)
    await asyncio.to_thread(_check_published, spec, mine[:done.parts])
    await jobs.write(status="running", cancel=0, error="", started_at=time.time())
    run.progress.start(spec.record_id, total, record.rows_done, record.failed)
    guard = EarlyStop(run.tuning.early_stop_rows, (), seen=record.rows_done,
                      max_rate=run.tuning.early_stop_rate, failed=record.failed)
    watch = None
    try:
        for part in mine[done.parts:]:
            pspec = spec.part_spec(part)
            publishing = done.phase == "publish"
            if publishing and not await asyncio.to_thread(publish_part, spec, part, pspec):
                log.warning("a part's staged output is gone before it was published; "
                            "scoring it again", part=part.name)
                publishing, start = False, Position()
            if not publishing:
                start = resume_point(pspec, start, part)
                source, close = await asyncio.to_thread(open_part, spec, part, pspec)
                try:
                    ctx = run.context(pspec, source)
                    watch = watch or worker_watch(ctx)

                    async def staged(final: Position) -> None:
                        await jobs.checkpoint(final, ds_phase="publish")

                    completed, start = await score_pass(
                        ctx, pspec, source, start, max(published, start.rows), guard, watch,
                        staged, base=Position(rows=done.rows, failed=done.failed))
                finally:
                    close()
                if not completed:
                    await jobs.write(status="cancelled", finished_at=time.time())
                    now = DatasetProgress(done.parts, done.rows + start.rows,
                                          done.succeeded + start.succeeded,
                                          done.failed + start.failed)
                    return _report(spec, now, "cancelled", resumed_from,
                                   time.monotonic() - began)
                await asyncio.to_thread(publish_part, spec, part, pspec)
            done = DatasetProgress(done.parts + 1, done.rows + start.rows,
                                   done.succeeded + start.succeeded, done.failed + start.failed)
            await jobs.checkpoint(Position(), **done.to_fields(), published=0)
            log.info("bulk part published", job_id=spec.record_id, part=part.name,
                     rows=start.rows, output=spec.output_of(part).url)
            start, published = Position(), 0
        await jobs.write(status="finished", finished_at=time.time(), total=done.rows)
        run.progress.update(done.rows, done.failed)
    finally:
        run.progress.stop()
    _remove_staging(spec)
    log.info("bulk job finished", job_id=spec.record_id, parts=done.parts, rows=done.rows,
             failed=done.failed)
    return _report(spec, done, "finished", resumed_from, time.monotonic() - began)


def _remove_staging(spec: DatasetSpec) -> None:
    """The runner's staging folder, and the default one holding it, once empty."""
    folders = [spec.staging]
    if spec.staging.parent.name in DEFAULT_STAGING:
        folders.append(spec.staging.parent)
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: a part another runner is writing stays


def _report(spec: DatasetSpec, done: DatasetProgress, status: str, resumed_from: int,
            elapsed_s: float) -> JobReport:
    return JobReport(spec.record_id, spec.model, status, spec.input.url, spec.output.url,
                     spec.output.child("_errors").url, done.rows, done.succeeded, done.failed,
                     done.rows - resumed_from, resumed_from, elapsed_s)
