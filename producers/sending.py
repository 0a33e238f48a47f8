"""The round trips of a submit, for a whole chunk of requests at once.

A submit records a ``pending`` result (never overwriting an existing one),
then publishes the request. A duplicate submit of a finished request ID is
not run again; a duplicate of a pending one is published again, which is
harmless because the first terminal result wins. A caller-chosen ID whose record
holds another fingerprint (other model or inputs) is a conflict: never published,
and its submit fails (``RequestConflictError``) while the rest of the chunk goes out.
Requests arrive here already encoded (``schemas.request_template``), so sending a
chunk costs its round trips and little else: two (store, then broker), or one when
the results and a Redis broker share one node (a broker's ``CombinedSubmit``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import structlog

from batchfleet.connectors import OneTrip, OutboundMessage, Publisher, SubmitState
from batchfleet.connectors.control_plane import Results
from batchfleet.connectors.errors import store_full
from batchfleet.connectors.values import Ownership
from batchfleet.producers.waiting import ResultWaiter
from batchfleet.schemas.errors import (
    BatchfleetError,
    OverloadedError,
    RequestConflictError,
    ResultStoreError,
    TransportError,
)
from batchfleet.schemas.request_template import RequestTemplate, pack_inputs
from batchfleet.schemas.tensors import as_array

log = structlog.get_logger("batchfleet.client")

_PUBLISHED = (SubmitState.NEW, SubmitState.PENDING)


class Outgoing(NamedTuple):
    """One encoded request: its envelope, its pending record and who owns it."""

    request_id: str
    payload: bytes
    pending: bytes
    template: RequestTemplate
    ownership: Ownership
    traceparent: str | None = None


class Sender:
    """Records and publishes chunks of :class:`Outgoing` (the coalescer's ``send``)."""

    def __init__(self, store: Results, publisher: Publisher, waiter: ResultWaiter,
                 shards: Mapping[str, int], one_trip: OneTrip | None = None) -> None:
        self._store = store
        self._one_trip = one_trip
        self._publisher = publisher
        self._waiter = waiter
        #: model -> lane_shards, kept up to date by the client's registry reads.
        self._shards = shards

    async def send(self, chunk: list[Outgoing]) -> list[int]:
        """Send a chunk; returns the positions of the requests refused as conflicts."""
        if self._one_trip is not None:
            return conflicts(await self._send_one_trip(self._one_trip, chunk))
        try:
            states = await self._store.put_pending([(o.request_id, o.pending) for o in chunk],
                                                   [o.ownership for o in chunk])
        except ResultStoreError as exc:
            raise_if_full(exc)
            raise
        new = SubmitState.NEW
        # before publishing, so that even the quickest announcement finds them expected
        self._waiter.expect([o.request_id for o, state in zip(chunk, states, strict=True)
                             if state == new])
        try:
            await self._publisher.publish([
                self._message(o) for o, state in zip(chunk, states, strict=True)
                if state in _PUBLISHED])
        except TransportError as exc:
            # Nothing was queued for the records this call created: withdraw them, so a
            # retry with the same ID (an idempotent resubmit) publishes instead of finding
            # a pending record that no message will ever answer.
            created = [o.request_id for o, state in zip(chunk, states, strict=True)
                       if state == new]
            try:
                await self._store.withdraw_pending(created)
            except ResultStoreError as undo:
                log.warning("could not withdraw the records of a failed submit",
                            error=str(undo), request_ids=len(created))
            raise_if_full(exc)
            raise
        return conflicts(states)

    def _message(self, o: Outgoing) -> OutboundMessage:
        return OutboundMessage(o.template.model, o.template.lane, o.request_id, o.payload,
                               o.traceparent, self._shards.get(o.template.model, 1))

    async def _send_one_trip(self, one_trip: OneTrip, chunk: list[Outgoing]
                             ) -> list[SubmitState]:
        ids = [o.request_id for o in chunk]
        # Expected before the script runs, as on the two-call path; those it did not
        # create are someone else's to announce, and are forgotten again.
        added = self._waiter.expect(ids)
        try:
            states = await one_trip.submit(
                [(o.request_id, o.pending) for o in chunk], [o.ownership for o in chunk],
                [self._message(o) for o in chunk])
        except TransportError as exc:
            self._waiter.unexpect(added)
            raise_if_full(exc)
            raise
        new = SubmitState.NEW
        self._waiter.unexpect([rid for rid, state in zip(ids, states, strict=True)
                               if state != new and rid in added])
        return states


def conflicts(states: Sequence[SubmitState]) -> list[int]:
    conflict = SubmitState.CONFLICT
    return [i for i, state in enumerate(states) if state == conflict]


def inputs_fingerprint(model: str, inputs: Any) -> str:
    """What a caller-chosen request ID stands for: the model and the inputs. Only such IDs
    are fingerprinted (a fresh ``uuid4`` cannot be reused), so a reuse with other inputs
    is refused instead of silently answered with the first request's result.

    One tensor (a list is the float32 array it is sent as) is hashed as its dtype, shape
    and little-endian bytes, with no packing: BLAKE2b from a per-model prefix costs about
    a microsecond a row. Named tensors are hashed as they are packed."""
    prefix = _PREFIXES.get(model)
    if prefix is None:
        if len(_PREFIXES) >= _MAX_CACHED:
            _PREFIXES.clear()
        prefix = _PREFIXES[model] = hashlib.blake2b(f"sdk\0{model}\0".encode(),
                                                    digest_size=16)
    digest = prefix.copy()
    arr = None if isinstance(inputs, Mapping) else as_array(inputs)
    if type(arr) is np.ndarray:
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        key = (arr.dtype.str, arr.shape)
        head = _HEADS.get(key)
        if head is None:
            if len(_HEADS) >= _MAX_CACHED:
                _HEADS.clear()
            head = _HEADS[key] = f"{key}\0".encode()
        digest.update(head)
        digest.update(arr.tobytes())
    else:
        digest.update(pack_inputs(inputs))
    return digest.hexdigest()


_PREFIXES: dict[str, Any] = {}
#: (dtype, shape) -> the bytes that start a tensor's fingerprint.
_HEADS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_MAX_CACHED = 1024


def conflict_error(refused: Sequence[Outgoing]) -> RequestConflictError:
    """The error a submit gets for its refused requests (``Coalescer(refuse=...)``)."""
    ids = [o.request_id for o in refused]
    shown = ", ".join(ids[:5]) + (" ..." if len(ids) > 5 else "")
    return RequestConflictError(
        f"{len(ids)} request ID(s) already used with another model or other inputs, so "
        f"not submitted (a wait would return the first request's result): {shown}; "
        "use a new ID for a new request", ids)


def raise_if_full(exc: BatchfleetError) -> None:
    """Redis refusing writes at ``maxmemory`` (a burst crossed the admission mark between
    two readings) is overload too: retryable, and nothing half-done needs undoing."""
    if store_full(exc):
        raise OverloadedError(f"Redis is full: {exc}", retry_after_s=1.0) from exc
