"""``--retry-failed``: run only the failed rows of a finished job again, under new IDs.

A failed result is terminal, and a duplicate submit of its request ID is (by
design) never run again, so each retry round has its own request IDs
(``{job}:{row}:r{round}``). The round is recorded before anything is
submitted, so a retry that is killed and run again reuses the same IDs and
the result store dedupes the rows it had already finished.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import structlog

from batchfleet.producers.bulk.errors import BulkError
from batchfleet.producers.bulk.guard import with_hint
from batchfleet.producers.bulk.job import Context
from batchfleet.producers.bulk.merge import discard_staging, open_merger
from batchfleet.producers.bulk.report import JobReport
from batchfleet.producers.bulk.rows import Position, Row
from batchfleet.producers.bulk.sources import count_lines
from batchfleet.producers.bulk.spec import request_id_for
from batchfleet.producers.bulk.window import Scorer
from batchfleet.schemas.envelopes import Result

log = structlog.get_logger("batchfleet.bulk")


def failed_rows(errors: Path) -> Iterator[int]:
    """Row indices listed in an errors file, in order (it is written in row order)."""
    with errors.open("rb") as f:
        for line in f:
            if line.strip():
                yield int(json.loads(line)["row"])


async def retry_failed_rows(ctx: Context) -> JobReport:
    spec, record, jobs = ctx.spec, ctx.record, ctx.jobs
    if record.status not in ("finished", "retrying"):
        raise BulkError(f"--retry-failed needs a finished job; {spec.job_id} is "
                        f"{record.display_status}: run it without --retry-failed first")
    retry_round = record.retry_round + (record.status == "finished")
    before = record.position
    todo = count_lines(spec.errors) if spec.errors.exists() else 0
    await jobs.write(status="retrying", round=retry_round, cancel=0, error="")
    began = time.monotonic()
    if todo == 0:
        await jobs.write(status="finished", finished_at=time.time())
        return _report(ctx, before, "finished", 0, 0.0, retry_round)
    log.info("retrying failed rows", job_id=spec.job_id, rows=todo, retry_round=retry_round)
    merger = await asyncio.to_thread(open_merger, spec, record.total)
    done = 0

    def write(row: Row, result: Result) -> None:
        nonlocal done
        merger.write(row, with_hint(result))
        done += 1

    async def tick() -> bool:
        ctx.progress.update(done, merger.current().failed)
        return not await jobs.write()

    scorer = Scorer(ctx.client, ctx.store, spec.model,
                    lambda row: request_id_for(spec.job_id, row, retry_round, record.epoch),
                    ctx.tuning, version=spec.version)
    ctx.progress.start(f"{spec.job_id} retry {retry_round}", todo, 0, 0)
    try:
        rows = ctx.source.rows(Position(), wanted=failed_rows(spec.errors))
        if not await scorer.run(rows, write, tick):
            merger.close()
            discard_staging(spec)
            await jobs.write(status="finished", cancel=0)  # the previous files stand
            return _report(ctx, before, "cancelled", done, time.monotonic() - began,
                           retry_round)
        failed = (await asyncio.to_thread(merger.finish)).failed
    except BaseException:
        merger.close()
        raise
    finally:
        ctx.progress.stop()
    after = replace(before, succeeded=before.rows - failed, failed=failed,
                    err_offset=spec.errors.stat().st_size,
                    out_offset=spec.output.stat().st_size if spec.format == "jsonl" else 0)
    await jobs.checkpoint(after, status="finished", finished_at=time.time())
    log.info("retry finished", job_id=spec.job_id, retried=todo, still_failed=failed)
    return _report(ctx, after, "finished", todo, time.monotonic() - began, retry_round)


def _report(ctx: Context, pos: Position, status: str, retried: int, elapsed_s: float,
            retry_round: int) -> JobReport:
    s = ctx.spec
    return JobReport(s.job_id, s.model, status, str(s.input), str(s.output), str(s.errors),
                     pos.rows, pos.succeeded, pos.failed, retried, 0, elapsed_s, retry_round)
