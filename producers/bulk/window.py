"""Submitting rows through a bounded window, and handing results back in input order.

At most ``window`` rows are between "read from the input" and "written to the
output" at any time. That one bound does three jobs: it is the backpressure
(the bulk lane never holds more than a window of this job's requests, so
interactive traffic on the same fleet never queues behind a whole file), it
bounds the reorder buffer (a slow row holds up at most a window), and it keeps
memory flat. Rows are submitted a chunk per round trip on the ``bulk`` lane
and collected as they finish; the writer takes them strictly in order.

A resumed job passes ``adopt_below``: rows below it were published by the run
that died, so they are waited for, not published again (no duplicate work),
unless their result record is gone (expired), in which case they are
resubmitted. A chunk with no result for ``stall_s`` is published again: the
first terminal result wins, so that can only cost a duplicate, never a wrong row.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence

import structlog

from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.control_plane import StoreResults
from batchfleet.producers.bulk.rows import INVALID_ROW, Row, encode_problem
from batchfleet.producers.bulk.spec import Tuning
from batchfleet.producers.client import AsyncClient
from batchfleet.schemas.envelopes import ErrorInfo, Result
from batchfleet.schemas.errors import RequestLostError, ValidationError, WaitTimeoutError
from batchfleet.schemas.names import LANE_BULK

log = structlog.get_logger("batchfleet.bulk")

Entry = tuple[int, Row]  # (sequence number in this pass, row)


class Slots:
    """A counting window with one waiter (the feeder) that takes many slots at once."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._freed = asyncio.Event()
        self._closed = False

    async def acquire(self, n: int) -> None:
        while self._free < n:
            if self._closed:
                raise asyncio.CancelledError("the window is closed")
            self._freed.clear()
            await self._freed.wait()
        self._free -= n

    def close(self) -> None:
        """No slot is ever freed again (the writer stopped): a waiting feeder ends."""
        self._closed = True
        self._freed.set()

    def release(self, n: int = 1) -> None:
        self._free += n
        self._freed.set()


class Scorer:
    def __init__(
        self, client: AsyncClient, store: StoreResults, model: str,
        request_id: Callable[[int], str], tuning: Tuning, *, adopt_below: int = 0,
        on_published: Callable[[int], Awaitable[None]] | None = None,
        version: str | None = None,
    ) -> None:
        self._client, self._store, self._model = client, store, model
        self._version = version
        self._rid, self._tuning = request_id, tuning
        self._adopt_below, self._on_published = adopt_below, on_published
        self._slots = Slots(tuning.window)
        self._buffer: dict[int, tuple[Row, Result]] = {}
        self._arrived = asyncio.Event()
        self._failure: BaseException | None = None
        self._fed: int | None = None
        self._collectors: set[asyncio.Task[None]] = set()

    async def run(self, rows: Iterable[Row], write: Callable[[Row, Result], None],
                  tick: Callable[[], Awaitable[bool]]) -> bool:
        """Score every row, calling ``write`` in input order and ``tick`` every checkpoint_s.

        Returns True when all rows were written, False when ``tick`` returned False (cancel).
        """
        feed = asyncio.create_task(self._feed(rows), name="bulk-feed")
        try:
            return await self._drain(write, tick)
        finally:
            self._slots.close()
            await cancel_until_done([feed, *self._collectors])

    async def _drain(self, write: Callable[[Row, Result], None],
                     tick: Callable[[], Awaitable[bool]]) -> bool:
        loop = asyncio.get_running_loop()
        next_seq = 0
        next_tick = loop.time() + self._tuning.checkpoint_s
        while True:
            self._arrived.clear()
            while next_seq in self._buffer:
                write(*self._buffer.pop(next_seq))
                next_seq += 1
                self._slots.release()
            if self._failure is not None:
                raise self._failure
            if self._fed is not None and next_seq >= self._fed:
                return True
            if loop.time() >= next_tick:
                if not await tick():
                    return False
                next_tick = loop.time() + self._tuning.checkpoint_s
            with contextlib.suppress(TimeoutError):
                await bounded(self._arrived.wait(), max(0.0, next_tick - loop.time()))

    def _fail(self, exc: BaseException) -> None:
        self._failure = self._failure or exc
        self._arrived.set()

    async def _feed(self, rows: Iterable[Row]) -> None:
        try:
            seq = 0
            it = iter(rows)
            while chunk := list(itertools.islice(it, self._tuning.chunk_rows)):
                await self._slots.acquire(len(chunk))
                await self._submit(list(enumerate(chunk, seq)))
                seq += len(chunk)
            self._fed = seq
            self._arrived.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the writer, which raises it
            self._fail(exc)

    def _answer(self, seq: int, row: Row, error: ErrorInfo) -> None:
        """A row that is never submitted: answered here, written in order with the rest."""
        self._buffer[seq] = (row, Result(self._rid(row.index), "failed", error=error,
                                         model=self._model))
        self._arrived.set()

    async def _submit(self, entries: list[Entry]) -> None:
        live: list[Entry] = []
        for seq, row in entries:
            if row.error is None:
                live.append((seq, row))
            else:
                self._answer(seq, row, row.error)
        if not live:
            return
        adopted = [e for e in live if e[1].index < self._adopt_below]
        fresh = [e for e in live if e[1].index >= self._adopt_below]
        if adopted:
            bodies = await self._store.get_bodies([self._rid(r.index) for _, r in adopted])
            fresh = [e for e, body in zip(adopted, bodies, strict=True) if body is None] + fresh
        refused = await self._publish_fresh(fresh)
        if refused:
            live = [e for e in live if e[0] not in refused]
        if fresh and self._on_published is not None:
            await self._on_published(fresh[-1][1].index + 1)
        task = asyncio.create_task(self._collect(live))
        self._collectors.add(task)
        task.add_done_callback(self._collectors.discard)

    async def _publish_fresh(self, entries: list[Entry]) -> set[int]:
        """Publish; if the envelope refuses the chunk, answer only the rows to blame.

        The sources already check each row against what the envelope refuses, so
        this is the last line of defence: one row those checks missed fails alone
        (``invalid_row``) instead of stopping the job. Returns the refused sequence
        numbers. A chunk refused for a reason no single row explains is re-raised.
        """
        try:
            await self._publish(entries)
            return set()
        except (ValidationError, ValueError, TypeError, OverflowError):
            problems = [encode_problem(row.inputs) for _, row in entries]
            if not any(problems):
                raise
        for (seq, row), problem in zip(entries, problems, strict=True):
            if problem is not None:
                self._answer(seq, row, ErrorInfo(INVALID_ROW, f"inputs refused: {problem}"))
        await self._publish([e for e, p in zip(entries, problems, strict=True) if p is None])
        return {seq for (seq, _), p in zip(entries, problems, strict=True) if p is not None}

    async def _publish(self, entries: Sequence[Entry]) -> None:
        if entries:
            await self._client.submit_many(
                self._model, [row.inputs for _, row in entries],
                request_ids=[self._rid(row.index) for _, row in entries], priority=LANE_BULK,
                version=self._version, degrade=self._tuning.degrade)

    async def _collect(self, entries: list[Entry]) -> None:
        pending = {self._rid(row.index): (seq, row) for seq, row in entries}
        try:
            while pending:
                try:
                    async for result in self._client.as_completed(list(pending),
                                                                  self._tuning.stall_s):
                        seq, row = pending.pop(result.request_id)
                        self._buffer[seq] = (row, result)
                        self._arrived.set()
                except (WaitTimeoutError, RequestLostError):  # lost with Redis: publish again
                    first = min(row.index for _, row in pending.values())
                    log.warning("bulk rows have no result; publishing them again",
                                rows=len(pending), first_row=first,
                                stall_s=self._tuning.stall_s)
                    await self._publish(sorted(pending.values(), key=lambda e: e[0]))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)
