"""Waiting for results without spinning: one pub/sub subscription per client.

Workers publish finished request IDs on the submitting client's own channel,
one message per client per batch. The listener fetches the bodies of the IDs
it is waiting for in one read. Pub/sub is at-most-once (a reconnect
can lose a message) and requests submitted by *another* client are announced
on that client's channel, so a slow safety poll (``poll_interval_s``, one
read of the outstanding IDs) covers both cases.

The waiter also remembers the IDs its own client has just submitted as new
(:meth:`expect`): their results will be announced here, so waiting on them
needs no first read, and an announcement that arrives before anyone waits is
noted rather than lost. That memory is bounded; what falls out of it is read
as any other ID would be. The safety poll reads such waits only every tenth
interval (all of them again after a reconnect), and reads bodies only of
results that are terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import structlog
from redis.exceptions import RedisError

from connectors.result_store import ResultStore
from schemas.envelopes import Result, decode_result
from schemas.errors import ResultStoreError, WaitTimeoutError
from schemas.names import Names

log = structlog.get_logger("batchfleet.client")

_READ_CHUNK = 2000
#: How many submitted-but-not-yet-awaited IDs the waiter remembers (about 100 bytes each).
_EXPECTED_CAP = 100_000
#: Waits whose announcement is due here are polled only every this many poll intervals.
_QUIET_POLL_EVERY = 10
_SUBSCRIBE_TIMEOUT_S = 10.0
_CLOSE_TIMEOUT_S = 2.0


class ResultWaiter:
    def __init__(
        self, store: ResultStore, names: Names, client_id: str, poll_interval_s: float = 1.0
    ) -> None:
        self._store = store
        self._channel = names.notify_channel(client_id)
        self._poll_interval_s = poll_interval_s
        self._waiters: dict[str, list[asyncio.Future[Result]]] = {}
        #: Submitted here and announced here; True once the announcement came.
        self._expected: dict[str, bool] = {}
        #: Waits on IDs submitted here: the safety poll can leave them be for a while.
        self._quiet: set[str] = set()
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        """Subscribe before anything is submitted, so no announcement can be missed."""
        if self._subscribed.is_set():  # every submit calls this: keep it free
            return
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="batchfleet-results")
        try:
            await asyncio.wait_for(self._subscribed.wait(), _SUBSCRIBE_TIMEOUT_S)
        except TimeoutError:
            raise ResultStoreError(
                f"cannot subscribe to result announcements within {_SUBSCRIBE_TIMEOUT_S}s: "
                "is the result store reachable?"
            ) from None

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            # bounded: a client must be able to exit even if the connection is wedged
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._listener, _CLOSE_TIMEOUT_S)
            self._listener = None
        for futures in self._waiters.values():
            for fut in futures:
                fut.cancel()
        self._waiters.clear()

    def expect(self, request_ids: Sequence[str]) -> None:
        """Note IDs this client submitted as new: their announcement will come here."""
        expected, waiters = self._expected, self._waiters
        for rid in request_ids:
            if rid in waiters:  # already awaited (registered before it was submitted)
                self._quiet.add(rid)
            else:
                expected[rid] = False
        while len(expected) > _EXPECTED_CAP:
            del expected[next(iter(expected))]

    def _needs_read(self, request_ids: Sequence[str]) -> list[str]:
        """The IDs whose result may already be stored: all but the expected, unannounced ones
        (which become quiet waits)."""
        expected, quiet = self._expected, self._quiet
        out = []
        for rid in request_ids:
            if expected.pop(rid, True):
                out.append(rid)
            else:
                quiet.add(rid)
        return out

    async def fetch(self, request_ids: Sequence[str], terminal_only: bool = False
                    ) -> list[Result | None]:
        """Current results; with ``terminal_only``, None for pending ones (not even read)."""
        out: list[Result | None] = []
        for start in range(0, len(request_ids), _READ_CHUNK):
            bodies = await self._store.get_bodies(request_ids[start:start + _READ_CHUNK],
                                                  terminal_only)
            out.extend(None if b is None else decode_result(b) for b in bodies)
        return out

    def _register(self, request_ids: Sequence[str]) -> list[asyncio.Future[Result]]:
        loop = asyncio.get_running_loop()
        futures = []
        for rid in request_ids:
            fut: asyncio.Future[Result] = loop.create_future()
            self._waiters.setdefault(rid, []).append(fut)
            futures.append(fut)
        return futures

    def _unregister(self, request_ids: Sequence[str], futures: Sequence[asyncio.Future[Result]]
                    ) -> None:
        for rid, fut in zip(request_ids, futures, strict=True):
            waiting = self._waiters.get(rid)
            if waiting and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._waiters[rid]
                    self._quiet.discard(rid)

    def _resolve(self, results: Sequence[Result | None]) -> None:
        for res in results:
            if res is None or not res.is_terminal:
                continue
            self._quiet.discard(res.request_id)
            for fut in self._waiters.pop(res.request_id, ()):
                if not fut.done():
                    fut.set_result(res)

    async def as_completed(
        self, request_ids: Sequence[str], timeout: float | None
    ) -> AsyncIterator[Result]:
        """Yield terminal results in the order they arrive; WaitTimeoutError if some never do."""
        await self.start()
        futures = self._register(request_ids)
        arrived: asyncio.Queue[asyncio.Future[Result]] = asyncio.Queue()
        for fut in futures:
            fut.add_done_callback(arrived.put_nowait)
        try:
            try:
                self._resolve(await self.fetch(self._needs_read(request_ids), True))
            except ResultStoreError as exc:
                # the store is restarting, say: the listener's poll picks these up once it is back
                log.warning("first read of results failed; waiting on the poll", error=str(exc))
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            for received in range(len(futures)):
                if not arrived.empty():  # results arrive a batch at a time: no timer needed
                    yield arrived.get_nowait().result()
                    continue
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    fut = await asyncio.wait_for(arrived.get(), left)
                except TimeoutError:
                    raise WaitTimeoutError(
                        f"{len(futures) - received} of {len(futures)} request(s) had no "
                        f"terminal result after {timeout}s"
                    ) from None
                yield fut.result()
        finally:
            self._unregister(request_ids, futures)

    async def wait_many(self, request_ids: Sequence[str], timeout: float | None) -> list[Result]:
        by_id = {r.request_id: r async for r in self.as_completed(request_ids, timeout)}
        return [by_id[rid] for rid in request_ids]

    async def _listen(self) -> None:
        """Resolve waiters from announcements, with a slow poll as the safety net."""
        backoff = 0.1
        while True:
            pubsub = self._store.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._subscribed.set()
                backoff = 0.1
                await self._pump(pubsub)
            except (RedisError, ResultStoreError, OSError) as exc:
                log.warning("result subscription lost; reconnecting", error=str(exc))
                self._expected.clear()  # announcements may be lost meanwhile: read those
                self._quiet.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(),  # type: ignore[no-untyped-call]
                                           _CLOSE_TIMEOUT_S)

    async def _pump(self, pubsub: object) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self._poll_interval_s
        polls = 0
        while True:
            message = await pubsub.get_message(timeout=self._poll_interval_s)  # type: ignore[attr-defined]
            if message is not None and message.get("type") == "message":
                ids = []
                for rid in message["data"].decode().split(","):
                    if rid in self._waiters:
                        ids.append(rid)
                    elif rid in self._expected:
                        self._expected[rid] = True  # done before anyone waited: read it then
                if ids:
                    self._resolve(await self.fetch(ids, True))
            if loop.time() >= next_poll:
                next_poll = loop.time() + self._poll_interval_s
                polls += 1
                # Waits on IDs submitted here are announced here: polling them every time
                # would reread every outstanding ID each second for nothing.
                due = list(self._waiters) if polls % _QUIET_POLL_EVERY == 0 else [
                    rid for rid in self._waiters if rid not in self._quiet]
                if due:
                    self._resolve(await self.fetch(due, True))
