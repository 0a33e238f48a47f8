"""Waiting for results without spinning: one pub/sub subscription per client.

Workers publish finished results, IDs with their bodies, on the submitting
client's own channel, one message per client per batch: a wait ends in one hop,
with no read-back. Pub/sub is at-most-once (a reconnect can lose a message) and
requests submitted by *another* client are announced on that client's channel,
so a slow safety poll (``poll_interval_s``, one read of the outstanding IDs)
covers both cases; after a reconnect every outstanding wait is read once. The poll
runs beside the listener, so however long it reads, no announcement waits for it.

The waiter also remembers the IDs its own client has just submitted as new
(:meth:`expect`): their results will be announced here, so waiting on them
needs no first read, and a result announced before anyone waits is kept
(its body) rather than lost. That memory is bounded by count and by bytes;
what falls out of it is read as any other ID would be. The safety poll reads
such waits only every tenth interval (all of them again after a reconnect), and
reads bodies only of results that are terminal.

Waits that can never end are ended (``RequestLostError``): the safety poll
also notices an ID whose record is gone (Redis lost its data, or the ID never
existed) and, once a worker has recorded a lane loss (``Names.lane_loss``), a
pending request enqueued on that model before the loss. Either must hold for
``loss_grace_s`` (a parameter of each wait; ``LOSS_GRACE_S`` by default) before the
wait is given up, so a submit racing the wait, or a batch a worker still holds, can
land first. The grace is counted per ID from the later of when *this* wait began and
when the ID was first seen lost, so a wait started before its IDs are submitted (by
this client, another waiter's submit, another process) gives each of them the whole
grace to appear; a wait on IDs submitted later than that needs a longer grace.
Edge: a request waiting in the retry schedule when its model's stream was lost is
reported lost although the retry pump will run it (its result, if it comes, is still
stored); and lane losses are checked per model, since a pending record does not say
its lane.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence

import structlog

from batchfleet.connectors.cancelling import bounded, cancel_until_done
from batchfleet.connectors.control_plane import Announcements, ControlPlane, Subscription
from batchfleet.connectors.values import Announced
from batchfleet.producers.expected import Expected
from batchfleet.producers.result_sink import Alarms, Sink
from batchfleet.producers.stage_stamps import StageStamps
from batchfleet.schemas.envelopes import Result, peek_header
from batchfleet.schemas.errors import (
    BatchfleetError,
    RequestLostError,
    ResultStoreError,
    ValidationError,
    WaitTimeoutError,
)
from batchfleet.schemas.names import Names
from batchfleet.schemas.result_decode import decode_result

log = structlog.get_logger("batchfleet.client")

_READ_CHUNK = 2000
#: Waits whose announcement is due here are polled only every this many poll intervals.
_QUIET_POLL_EVERY = 10
_SUBSCRIBE_TIMEOUT_S = 10.0
#: How long a wait must look lost (record gone, or lane lost after it) before it ends,
#: unless the client or the wait says otherwise (``loss_grace_s``).
LOSS_GRACE_S = 2.0


class ResultWaiter:
    def __init__(
        self, plane: ControlPlane, names: Names, client_id: str, poll_interval_s: float = 1.0,
        loss_grace_s: float = LOSS_GRACE_S, announcements: Announcements | None = None,
    ) -> None:
        self._store = plane.results
        #: Where finished IDs are announced: the plane's own seam unless told otherwise.
        self._announcements = announcements or plane.announcements
        self._client_id = client_id
        self._loss_grace_s = loss_grace_s
        #: Waits that looked lost at the last poll, with when they were first seen so.
        self._suspects: dict[str, float] = {}
        #: (model, enqueued_at) of pending waits, read once, only while lane losses exist.
        self._pending_info: dict[str, tuple[str, float]] = {}
        self._lane_losses: dict[str, int] = {}
        self._poll_interval_s = poll_interval_s
        self._waiters: dict[str, list[Sink]] = {}
        #: The waits' timeouts, sharing a timer per tick.
        self._alarms = Alarms()
        #: Submitted here and announced here: None until the announcement came, then the
        #: result's body (so a later wait needs no read).
        self._expected = Expected()
        #: IDs read back from the store (not announced): the one-hop path keeps this low.
        self.body_reads = 0
        #: Waits on IDs submitted here: the safety poll can leave them be for a while.
        self._quiet: set[str] = set()
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        #: When announced results reached here, if asked (``producers.stage_stamps``).
        self.stages: StageStamps | None = None

    async def start(self) -> None:
        """Subscribe before anything is submitted, so no announcement can be missed."""
        if self._subscribed.is_set():  # every submit calls this: keep it free
            return
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="batchfleet-results")
        try:
            await bounded(self._subscribed.wait(), _SUBSCRIBE_TIMEOUT_S)
        except TimeoutError:
            raise ResultStoreError(
                f"cannot subscribe to result announcements within {_SUBSCRIBE_TIMEOUT_S}s: "
                "is the result store reachable?"
            ) from None

    async def close(self) -> None:
        if self._listener is not None:
            # cancelled until it is gone: a wedged read ends at the cancel, and a
            # cancel dropped by 3.11's wait_for is sent again
            await cancel_until_done([self._listener])
            self._listener = None
        for sinks in self._waiters.values():
            for sink in sinks:
                sink.cancel()
        self._waiters.clear()

    def expect(self, request_ids: Sequence[str]) -> set[str]:
        """Note IDs this client submitted as new: their announcement will come here.
        Returns those it was not already expecting (what :meth:`unexpect` may undo); an
        ID already expected, or whose result already arrived, is left as it is."""
        expected, waiters, quiet = self._expected, self._waiters, self._quiet
        added: set[str] = set()
        for rid in request_ids:
            if rid in waiters:  # already awaited (registered before it was submitted)
                if rid not in quiet:
                    quiet.add(rid)
                    added.add(rid)
            elif expected.add(rid):
                added.add(rid)
        expected.trim()
        return added

    def unexpect(self, request_ids: Iterable[str]) -> None:
        """Undo :meth:`expect` for IDs (from its return value) whose submit created
        nothing (a duplicate, a failure): their announcement goes to another client."""
        expected, quiet = self._expected, self._quiet
        for rid in request_ids:
            expected.discard_unarrived(rid)
            quiet.discard(rid)

    def _take_expected(self, request_ids: Sequence[str]) -> tuple[list[str], list[Result]]:
        """Split waits into IDs whose result may already be stored (to read) and results
        already announced here; expected, unannounced ones become quiet waits."""
        expected, quiet = self._expected, self._quiet
        to_read: list[str] = []
        arrived: list[bytes] = []
        for rid in request_ids:
            if rid not in expected:
                to_read.append(rid)
                continue
            body = expected.take(rid)
            if body is None:
                quiet.add(rid)
            else:
                arrived.append(body)
        return to_read, self._decode(arrived, to_read)

    def _decode(self, bodies: Sequence[bytes], unreadable: list[str]) -> list[Result]:
        """Decode announced bodies; one that does not decode is read back instead."""
        out = []
        for body in bodies:
            try:
                out.append(decode_result(body))
            except BatchfleetError as exc:
                log.warning("an announced result did not decode; reading it back",
                            error=str(exc))
                rid = _peek_id(body)
                if rid is not None:
                    unreadable.append(rid)
        return out

    async def fetch(self, request_ids: Sequence[str], terminal_only: bool = False
                    ) -> list[Result | None]:
        """Current results; with ``terminal_only``, None for pending ones (not even read)."""
        out: list[Result | None] = []
        self.body_reads += len(request_ids)
        for start in range(0, len(request_ids), _READ_CHUNK):
            bodies = await self._store.get_bodies(request_ids[start:start + _READ_CHUNK],
                                                  terminal_only)
            out.extend(None if b is None else decode_result(b) for b in bodies)
        return out

    def _register(self, request_ids: Sequence[str], sink: Sink) -> None:
        waiters = self._waiters
        for rid in request_ids:
            sinks = waiters.get(rid)
            if sinks is None:
                waiters[rid] = [sink]
            else:
                sinks.append(sink)

    def _unregister(self, request_ids: Sequence[str], sink: Sink) -> None:
        for rid in request_ids:
            waiting = self._waiters.get(rid)
            if waiting and sink in waiting:
                waiting.remove(sink)
                if not waiting:
                    del self._waiters[rid]
                    self._quiet.discard(rid)
                    self._suspects.pop(rid, None)
                    self._pending_info.pop(rid, None)

    def _resolve(self, results: Sequence[Result | None]) -> None:
        for res in results:
            if res is None or not res.is_terminal:
                continue
            self._quiet.discard(res.request_id)
            self._suspects.pop(res.request_id, None)
            self._pending_info.pop(res.request_id, None)
            for sink in self._waiters.pop(res.request_id, ()):
                sink.deliver(res)

    def _give_up(self, lost: Sequence[tuple[str, Sink]]) -> None:
        """End the waits of these sinks on these IDs; other waits on them go on."""
        for rid, sink in lost:
            self._unregister((rid,), sink)
            sink.lose(rid)

    async def _check_lost(self, unresolved: Sequence[str]) -> None:
        """End the waits on IDs that looked lost for ``loss_grace_s`` (see the module doc)."""
        lost_now: set[str] = set()
        for start in range(0, len(unresolved), _READ_CHUNK):
            lost_now.update(await self._store.missing(unresolved[start:start + _READ_CHUNK]))
        if self._lane_losses:
            unread = [rid for rid in unresolved
                      if rid not in lost_now and rid not in self._pending_info]
            for rid, res in zip(unread, await self.fetch(unread), strict=True):
                if res is not None and not res.is_terminal:
                    self._pending_info[rid] = (res.model, res.enqueued_at)
            for rid in unresolved:
                info = self._pending_info.get(rid)
                if info is not None and lost_in_lane(info, self._lane_losses):
                    lost_now.add(rid)
        loop_now = asyncio.get_running_loop().time()
        for rid in list(self._suspects):
            if rid not in lost_now:
                del self._suspects[rid]
        expired: list[tuple[str, Sink]] = []
        for rid in lost_now:
            since = self._suspects.setdefault(rid, loop_now)
            # per wait: never sooner than its own grace after it began
            expired.extend((rid, sink) for sink in self._waiters.get(rid, ())
                           if loop_now - max(since, sink.started_at) >= sink.loss_grace_s)
        if expired:
            log.warning("requests lost: their record or their lane's entries are gone",
                        count=len(expired), request_ids=[rid for rid, _ in expired[:5]])
            self._give_up(expired)

    async def as_completed(
        self, request_ids: Sequence[str], timeout: float | None,
        loss_grace_s: float | None = None,
    ) -> AsyncIterator[Result]:
        """Yield terminal results in the order they arrive; WaitTimeoutError if some never do.

        Lost requests (see the module doc) are not yielded: once every other one has been,
        RequestLostError names them all. ``loss_grace_s`` (default: the waiter's) is how
        long an ID may look lost, counted from this call at the earliest."""
        grace = self._loss_grace_s if loss_grace_s is None else loss_grace_s
        if grace < 0:
            raise ValidationError(f"loss_grace_s must not be negative, got {grace}")
        await self.start()
        loop = asyncio.get_running_loop()
        sink = Sink(loop.time(), grace)
        self._register(request_ids, sink)
        # One alarm for the whole call, not one per wait, sharing a timer with others.
        alarm = None if timeout is None else self._alarms.set(loop, timeout, sink)
        try:
            to_read, announced = self._take_expected(request_ids)
            self._resolve(announced)
            try:
                if to_read:
                    self._resolve(await self.fetch(to_read, True))
            except ResultStoreError as exc:
                # the store is restarting, say: the listener's poll picks these up once it is back
                log.warning("first read of results failed; waiting on the poll", error=str(exc))
            total, received = len(request_ids), 0
            ready, lost = sink.ready, sink.lost
            while received + len(lost) < total:
                if not ready:  # results arrive a batch at a time: one wake-up per batch
                    if sink.cancelled:
                        raise asyncio.CancelledError
                    if sink.timed_out:
                        raise WaitTimeoutError(
                            f"{total - received - len(lost)} of {total} request(s) had no "
                            f"terminal result after {timeout}s"
                            + (f" ({len(lost)} more were lost)" if lost else ""))
                    sink.wake = loop.create_future()
                    await sink.wake
                    continue
                received += 1
                yield ready.popleft()
            if lost:
                raise RequestLostError(list(lost))
        finally:
            if alarm is not None:
                self._alarms.clear(alarm, sink)
            self._unregister(request_ids, sink)

    async def wait_many(self, request_ids: Sequence[str], timeout: float | None,
                        loss_grace_s: float | None = None) -> list[Result]:
        """Terminal results in ``request_ids`` order. If some were lost, RequestLostError
        names them once the rest have finished, with ``results`` in the same order (None
        where lost)."""
        by_id: dict[str, Result] = {}
        try:
            async for r in self.as_completed(request_ids, timeout, loss_grace_s):
                by_id[r.request_id] = r
        except RequestLostError as exc:
            exc.results = [by_id.get(rid) for rid in request_ids]
            raise
        return [by_id[rid] for rid in request_ids]

    async def _listen(self) -> None:
        """Resolve waiters from announcements, with a slow poll as the safety net."""
        backoff = 0.1
        reconnect = False
        while True:
            subscription: Subscription | None = None
            try:
                subscription = await self._announcements.subscribe(self._client_id)
                self._subscribed.set()
                backoff = 0.1
                # what was announced while away is lost: every wait is read at once
                read_all, reconnect = reconnect, True
                await self._pump(subscription, read_all)
            except ResultStoreError as exc:
                log.warning("result subscription lost; reconnecting", error=str(exc))
                self._expected.forget_unannounced()  # some may be lost meanwhile: read those
                self._quiet.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if subscription is not None:
                    await subscription.close()

    async def _pump(self, subscription: Subscription, read_all: bool) -> None:
        """Take announcements as they come. The safety poll runs beside them, never in
        their way: with many outstanding waits it reads for seconds (100,000 IDs took 2 s
        in the bench), and announcements held behind it reached their callers that late.
        A poll that fails ends the pump, so the subscription is made again."""
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self._poll_interval_s
        polls = 0
        poll = asyncio.create_task(self._poll(everything=True)) if read_all else None
        try:
            while True:
                announced = await subscription.next(self._poll_interval_s)
                if announced:
                    await self._take(announced)
                if poll is not None and poll.done():
                    poll.result()
                    poll = None
                if poll is None and loop.time() >= next_poll:
                    next_poll = loop.time() + self._poll_interval_s
                    polls += 1
                    poll = asyncio.create_task(self._poll(polls % _QUIET_POLL_EVERY == 0))
        finally:
            if poll is not None:
                await cancel_until_done([poll])

    async def _take(self, announced: Sequence[Announced]) -> None:
        """Resolve the waits an announcement names; keep what arrived before its wait."""
        received = time.time() if self.stages is not None else 0.0
        bodies: list[bytes] = []
        unreadable: list[str] = []
        for rid, body in announced:
            if body is None:  # the ID alone (a cancel, §8): read it back
                if rid in self._waiters:
                    unreadable.append(rid)
                else:
                    self._expected.discard_unarrived(rid)  # so a later wait reads it
            elif rid in self._waiters:
                bodies.append(body)
            elif rid in self._expected:
                self._expected.keep(rid, body)  # done before anyone waited: kept for then
        decoded = self._decode(bodies, unreadable)
        self._resolve(decoded)
        if self.stages is not None:
            self.stages.record((r.request_id for r in decoded), received, time.time())
        if unreadable:
            self._resolve(await self.fetch(unreadable, True))

    async def _poll(self, everything: bool) -> None:
        """The safety poll: read the waits whose announcement may not come (all of them
        when ``everything``), and end those that look lost past their grace."""
        # Waits on IDs submitted here are announced here: polling them every time
        # would reread every outstanding ID each second for nothing.
        # Merged, never forgotten: the hash itself can be lost (evicted, flushed).
        seen = self._lane_losses
        losses = {**seen, **{k: max(v, seen.get(k, v))
                             for k, v in (await self._store.lane_losses()).items()}}
        everything = everything or losses != seen
        self._lane_losses = losses
        # Suspected losses are looked at every time, so they end after the grace.
        due = list(self._waiters) if everything else [
            rid for rid in self._waiters if rid not in self._quiet or rid in self._suspects]
        if due:
            results = await self.fetch(due, True)
            self._resolve(results)
            await self._check_lost([rid for rid, r in zip(due, results, strict=True)
                                    if r is None])

def _peek_id(body: bytes) -> str | None:
    """The request ID of a body that does not decode as a result, if it has one."""
    rid = peek_header(body).get("id")
    return rid if isinstance(rid, str) else None


def lost_in_lane(info: tuple[str, float], losses: dict[str, int]) -> bool:
    """Enqueued on its model before one of that model's lanes lost its entries."""
    model, enqueued_at = info
    enqueued_ms = enqueued_at * 1000.0
    # fields are "{lane model}:{lane}", where a version lane's model is "{model}@{label}"
    return any(field.partition(":")[0].partition("@")[0] == model and enqueued_ms < ms
               for field, ms in losses.items())
