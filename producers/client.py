"""The SDK upstream services use: ``AsyncClient`` and its blocking twin ``Client``.

A submit records a ``pending`` result (never overwriting an existing one),
then publishes the request. A duplicate submit of a finished request ID is
not run again; a duplicate of a pending one is published again, which is
harmless because the first terminal result wins. ``submit_many`` does both
steps for a whole chunk in one round trip each.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from connectors import (
    BrokerURL,
    OutboundMessage,
    SubmitState,
    open_publisher,
    open_result_store,
    results_url_for,
)
from connectors.result_store import DEFAULT_TTL_S
from connectors.ssrf import CallbackPolicy
from producers.coalescing import Coalescer
from producers.waiting import ResultWaiter
from schemas.envelopes import Request, Result, encode_request, encode_result
from schemas.errors import UnknownModelError, ValidationError, WaitTimeoutError
from schemas.names import LANE_BULK, LANE_INTERACTIVE, Names, check_lane

T = TypeVar("T")

#: ``priority=`` accepts lane names and these friendlier aliases.
PRIORITIES = {"interactive": LANE_INTERACTIVE, "high": LANE_INTERACTIVE,
              "bulk": LANE_BULK, "low": LANE_BULK}
SUBMIT_CHUNK = 1000


def new_request_id() -> str:
    return uuid.uuid4().hex


class AsyncClient:
    """Submit requests and get their results, from asyncio code.

    >>> async with AsyncClient("redis://localhost:6379/0") as client:
    ...     rid = await client.submit("demo-mlp", [0.1] * 10)
    ...     result = await client.wait(rid, timeout=5)
    """

    def __init__(
        self,
        broker: str,
        results: str | None = None,
        *,
        namespace: str = "bf",
        result_ttl_s: int = DEFAULT_TTL_S,
        kafka_partitions: int = 4,
        poll_interval_s: float = 1.0,
        check_model: bool = True,
        callback_policy: CallbackPolicy | None = None,
    ) -> None:
        parsed = BrokerURL.parse(broker)
        self.names = Names(namespace)
        self.client_id = uuid.uuid4().hex[:16]
        self._store = open_result_store(results_url_for(parsed, results), self.names,
                                        result_ttl_s)
        self._publisher = open_publisher(parsed, self.names, partitions=kafka_partitions)
        self._waiter = ResultWaiter(self._store, self.names, self.client_id, poll_interval_s)
        self._check_model = check_model
        self._singles: Coalescer[tuple[Request, bytes]] = Coalescer(self._send, SUBMIT_CHUNK)
        self._known_models: set[str] = set()
        #: Callback URLs are checked at submit (no DNS), so a bad one is refused up front;
        #: the webhook worker checks again, resolved, before it calls one.
        self._callback_policy = callback_policy or CallbackPolicy()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._waiter.close()
        await self._publisher.close()
        await self._store.close()

    def _request(
        self, model: str, inputs: Any, request_id: str | None, priority: str,
        deadline_s: float | None, callback_url: str | None, now: float,
    ) -> Request:
        lane = PRIORITIES.get(priority, priority)
        check_lane(lane)
        if deadline_s is not None and deadline_s <= 0:
            raise ValidationError(f"deadline_s must be positive, got {deadline_s}")
        return Request(
            request_id=request_id or new_request_id(), model=model, inputs=inputs, lane=lane,
            enqueued_at=now, deadline_at=None if deadline_s is None else now + deadline_s,
            callback_url=callback_url, notify=self.client_id,
        )

    async def submit(
        self, model: str, inputs: Any, *, request_id: str | None = None,
        priority: str = LANE_INTERACTIVE, deadline_s: float | None = None,
        callback_url: str | None = None,
    ) -> str:
        """Enqueue one request; returns its request ID. Bad input raises ValidationError now.

        Concurrent calls are coalesced into one round trip (see ``producers.coalescing``).
        """
        if callback_url is not None:
            self._callback_policy.check_url(callback_url)
        await self._ensure_known(model)
        await self._waiter.start()
        req = self._request(model, inputs, request_id, priority, deadline_s, callback_url,
                            time.time())
        await self._singles.submit((req, encode_request(req)))
        return req.request_id

    async def submit_many(
        self, model: str, inputs: Iterable[Any], *, request_ids: Sequence[str] | None = None,
        priority: str = LANE_INTERACTIVE, deadline_s: float | None = None,
        callback_url: str | None = None,
    ) -> list[str]:
        """Enqueue many requests to one model, pipelined in chunks of ``SUBMIT_CHUNK``.

        Raises UnknownModelError for a model no worker has ever served (unless the
        client was made with ``check_model=False``), rather than letting it wait forever.
        """
        if callback_url is not None:
            self._callback_policy.check_url(callback_url)
        await self._ensure_known(model)
        await self._waiter.start()
        ids: list[str] = []
        chunk: list[tuple[Request, bytes]] = []
        id_iter = iter(request_ids) if request_ids is not None else None
        for item in inputs:
            rid = next(id_iter, None) if id_iter is not None else None
            if id_iter is not None and rid is None:
                raise ValidationError("request_ids is shorter than inputs")
            req = self._request(model, item, rid, priority, deadline_s, callback_url, time.time())
            chunk.append((req, encode_request(req)))
            ids.append(req.request_id)
            if len(chunk) >= SUBMIT_CHUNK:
                await self._send(chunk)
                chunk = []
        if chunk:
            await self._send(chunk)
        return ids

    async def _ensure_known(self, model: str) -> None:
        if not self._check_model or model in self._known_models:
            return
        self._known_models = await self._store.known_models()
        if model not in self._known_models:
            known = ", ".join(sorted(self._known_models)) or "none yet"
            raise UnknownModelError(
                f"no worker serves model {model!r} (known models: {known}); start a worker "
                f"with --model {model}, or create the client with check_model=False"
            )

    async def _send(self, chunk: list[tuple[Request, bytes]]) -> None:
        pending = [
            (req.request_id, encode_result(Result(
                req.request_id, "pending", model=req.model, enqueued_at=req.enqueued_at)))
            for req, _ in chunk
        ]
        states = await self._store.put_pending(pending)
        # before publishing, so that even the quickest announcement finds them expected
        self._waiter.expect([rid for (rid, _), state in zip(pending, states, strict=True)
                             if state == SubmitState.NEW])
        await self._publisher.publish([
            OutboundMessage(req.model, req.lane, req.request_id, payload)
            for (req, payload), state in zip(chunk, states, strict=True)
            if state != SubmitState.TERMINAL
        ])

    async def get(self, request_id: str) -> Result | None:
        """The current result (``pending`` or terminal), or None for an unknown ID."""
        return (await self._waiter.fetch([request_id]))[0]

    async def wait(self, request_id: str, timeout: float | None = 30.0) -> Result:
        """Block until the request is terminal; raises WaitTimeoutError after ``timeout`` s."""
        return (await self._waiter.wait_many([request_id], timeout))[0]

    async def wait_many(
        self, request_ids: Sequence[str], timeout: float | None = 60.0
    ) -> list[Result]:
        """Terminal results in the order of ``request_ids``."""
        return await self._waiter.wait_many(request_ids, timeout)

    def as_completed(
        self, request_ids: Sequence[str], timeout: float | None = 60.0
    ) -> AsyncIterator[Result]:
        """Terminal results as they arrive (for progress bars and latency measurement)."""
        return self._waiter.as_completed(request_ids, timeout)


class Client:
    """The blocking SDK: the same API as :class:`AsyncClient`, on a private event loop thread.

    >>> with Client("redis://localhost:6379/0") as client:
    ...     rid = client.submit("demo-mlp", [0.1] * 10)
    ...     print(client.wait(rid, timeout=5).outputs)
    """

    def __init__(self, broker: str, results: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="batchfleet-client",
                                        daemon=True)
        self._thread.start()
        self._async = self._call(_make_async(broker, results, options))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def submit(self, model: str, inputs: Any, **options: Any) -> str:
        return self._call(self._async.submit(model, inputs, **options))

    def submit_many(self, model: str, inputs: Iterable[Any], **options: Any) -> list[str]:
        return self._call(self._async.submit_many(model, inputs, **options))

    def get(self, request_id: str) -> Result | None:
        return self._call(self._async.get(request_id))

    def wait(self, request_id: str, timeout: float | None = 30.0) -> Result:
        return self._call(self._async.wait(request_id, timeout))

    def wait_many(self, request_ids: Sequence[str], timeout: float | None = 60.0
                  ) -> list[Result]:
        return self._call(self._async.wait_many(request_ids, timeout))


async def _make_async(broker: str, results: str | None, options: dict[str, Any]) -> AsyncClient:
    return AsyncClient(broker, results, **options)


__all__ = ["AsyncClient", "Client", "WaitTimeoutError", "new_request_id"]
