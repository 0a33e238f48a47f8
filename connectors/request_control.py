"""Request control: cancel queued requests, empty a lane, and the cancel set workers read.

A **cancel** writes a terminal ``cancelled`` result through the store's
first-terminal-wins write (``ResultStore.write_terminal``), so exactly one terminal
status holds whoever races it, then adds the ID to the cancel set
(``Names.cancelled``). Workers look at that set only while it is non-empty (its size
cached for a second, ``workers.middleware.cancels``) and drop a cancelled request
unrun right before its batch computes. The write comes first: a crash between the
two leaves a ``cancelled`` result whose request may still run, and lose its write.

"Already running" is what the broker can tell: on Redis Streams a request a worker
has fetched (it is in the group's pending list, which is what the worker's lease
keeps alive) is left to finish, and the cancel says so. Kafka cannot tell which
records a worker holds, so there a pending request is always marked ``cancelled``;
a worker that already started it still finishes, and its result is discarded. One
that has not drops it unrun through the cancel set, as on Redis.

A **lane purge** pages through one model's stream (``XRANGE``, 500 at a time),
writes ``cancelled`` for every entry no worker holds (announced to its submitter,
so waiters end at once), sends entries without a readable request ID to the
undecodable DLQ, then deletes the page (``XDEL``). Entries a worker already holds
are left to finish and counted. Kafka cannot delete records from a topic, so a purge
there is refused (``ConfigError``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from batchfleet.connectors.cluster_multi import transaction
from batchfleet.connectors.dead_letters import UndecodableSink
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.redis_streams import PAYLOAD_FIELD
from batchfleet.connectors.result_store import ResultStore
from batchfleet.connectors.urls import BrokerURL
from batchfleet.connectors.values import TerminalWrite, Undecodable
from batchfleet.schemas.envelopes import (
    TERMINAL_STATUSES,
    ErrorInfo,
    Result,
    decode_request_header,
    decode_result,
    encode_result,
    lua_exact_generation,
    peek_header,
)
from batchfleet.schemas.errors import ConfigError, DecodeError, ResultStoreError, TransportError
from batchfleet.schemas.names import LANES, Names

Outcome = Literal["cancelled", "already_running", "already_finished", "unknown"]

CANCELLED = ErrorInfo("cancelled", "cancelled before a worker computed it")
PURGED = ErrorInfo("cancelled", "its lane was purged before a worker computed it")
#: Cancelled IDs older than this leave the cancel set even if no worker ever fetched
#: them (their entry was purged or lost): the set must empty again for workers to stop
#: looking. A copy fetched later still runs, and its write loses to ``cancelled``.
CANCEL_SET_KEEP_S = 3600
#: At most this many of a lane's held (pending) entries are looked at per cancel.
_HELD_SCAN = 10_000
PAGE = 500

_TAKE = """
local out = {}
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then out[#out + 1] = ARGV[i] end
end
return out
"""


@dataclass(frozen=True, slots=True)
class CancelReport:
    """What a cancel did to one request ID; ``status`` is its stored status afterwards."""

    request_id: str
    outcome: Outcome
    status: str | None

    @property
    def message(self) -> str:
        """One human line, as the CLI prints it."""
        return {"cancelled": "cancelled",
                "already_running": "already running: a worker holds it and it will finish",
                "already_finished": f"already finished ({self.status})",
                "unknown": "unknown (never submitted, or expired from the result store)",
                }[self.outcome]


@dataclass(slots=True)
class PurgeReport:
    model: str
    #: IDs answered ``cancelled`` (their entries deleted).
    cancelled: list[str] = field(default_factory=list)
    #: Entries deleted whose request was already terminal, or superseded by a replay.
    dropped: int = 0
    #: Entries without a readable request ID, moved to the undecodable DLQ.
    undecodable: int = 0
    #: Entries a worker already held: left to finish.
    held: int = 0


class CancelSet:
    """The worker's side: how many IDs are cancelled, and taking the cancelled ones out of a
    batch (removed from the set as they are dropped, so it empties again)."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._key = names.cancelled
        self._take = client.register_script(_TAKE)

    async def size(self) -> int:
        with wrap_errors(ResultStoreError, "cannot read the cancel set"):
            return int(await self._redis.zcard(self._key))

    async def take(self, request_ids: Sequence[str]) -> set[str]:
        """Which of these IDs were cancelled; removed from the set in the same call."""
        if not request_ids:
            return set()
        with wrap_errors(ResultStoreError, "cannot read the cancel set"):
            taken = await self._take(keys=[self._key], args=list(dict.fromkeys(request_ids)))
        return {t.decode() if isinstance(t, bytes) else t for t in taken}


class RequestControl:
    """Cancel and purge, over a result store and (Redis Streams) the broker's Redis.

    ``lanes`` is a client of the broker's Redis, or None on Kafka. Errors are the
    project's (``ResultStoreError``, ``TransportError``, ``ConfigError``)."""

    def __init__(self, store: ResultStore, lanes: aioredis.Redis | None) -> None:
        self._store = store
        self._names = store.names
        self._lanes = lanes
        self._undecodable = UndecodableSink(store.redis, store.names)

    async def close(self) -> None:
        if self._lanes is not None:
            await self._lanes.aclose()

    # --- cancel ----------------------------------------------------------------------

    async def cancel(self, request_ids: Sequence[str]) -> list[CancelReport]:
        """Cancel queued requests; one report per distinct ID, in order. A few round trips
        whatever the number of IDs (plus, on Redis Streams, one read of each involved
        lane's pending entries, which are bounded by what workers hold)."""
        ids = list(dict.fromkeys(request_ids))
        reports: dict[str, CancelReport] = {}
        todo = ids
        for _ in range(3):  # a replay racing the cancel raises the generation: read again
            todo = await self._cancel_round(todo, reports)
            if not todo:
                break
        for rid in todo:
            reports[rid] = CancelReport(rid, "already_running", "pending")
        return [reports[rid] for rid in ids]

    async def _cancel_round(self, ids: Sequence[str], reports: dict[str, CancelReport]
                            ) -> list[str]:
        views = await self._store.cancel_views(ids)
        pending: dict[str, tuple[Result, int, str | None]] = {}
        for rid, view in zip(ids, views, strict=True):
            if view is None:
                reports[rid] = CancelReport(rid, "unknown", None)
            elif view.status in TERMINAL_STATUSES:
                reports[rid] = CancelReport(rid, "already_finished", view.status)
            else:
                pending[rid] = (_pending_result(rid, view.body), view.generation, view.notify)
        held = await self._held({r.model for r, _, _ in pending.values()}, set(pending))
        writes = []
        for rid, (res, gen, notify) in pending.items():
            if rid in held:
                reports[rid] = CancelReport(rid, "already_running", "pending")
            else:
                writes.append(TerminalWrite(rid, "cancelled",
                                            encode_result(_cancelled(res, gen, CANCELLED)),
                                            notify, gen))
        won = await self._store.write_terminal(writes)
        await self._add_to_set([w.request_id for w, ok in zip(writes, won, strict=True) if ok])
        retry = []
        for write, ok in zip(writes, won, strict=True):
            if ok:
                reports[write.request_id] = CancelReport(write.request_id, "cancelled",
                                                         "cancelled")
            else:
                retry.append(write.request_id)  # finished meanwhile, or replayed
        return retry

    async def _add_to_set(self, ids: Sequence[str]) -> None:
        """Both transports: a Kafka worker reads no record at a first delivery either
        (``workers.log_positions``), so the set is what tells it."""
        if not ids:
            return
        now = time.time()
        with wrap_errors(ResultStoreError, "cannot record cancelled requests"):
            pipe = await transaction(self._store.redis)
            pipe.zadd(self._names.cancelled, dict.fromkeys(ids, now))
            pipe.zremrangebyscore(self._names.cancelled, "-inf", now - CANCEL_SET_KEEP_S)
            await pipe.execute()

    async def _held(self, models: Iterable[str], wanted: set[str]) -> set[str]:
        """Which of ``wanted`` a worker holds (fetched, not acked) on these models' lanes:
        two pipelined round trips, bounded by the pending entries, never a scan."""
        if self._lanes is None or not wanted:
            return set()
        streams = await self._shard_streams(sorted(m for m in models if m), LANES)
        group = self._names.consumer_group
        pipe = self._lanes.pipeline(transaction=False)
        for stream in streams:
            pipe.xpending_range(stream, group, "-", "+", _HELD_SCAN)
        with wrap_errors(TransportError, "cannot read the lanes' pending entries"):
            replies = await pipe.execute(raise_on_error=False)
            entries = [(s, p["message_id"]) for s, reply in zip(streams, replies, strict=True)
                       if not isinstance(reply, ResponseError) for p in reply]
            if not entries:
                return set()
            pipe = self._lanes.pipeline(transaction=False)
            for stream, entry_id in entries:
                pipe.xrange(stream, entry_id, entry_id)
            found = await pipe.execute()
        held = set()
        for rows in found:
            for _, fields in rows:
                rid = _peek_id((fields or {}).get(PAYLOAD_FIELD, b""))
                if rid in wanted:
                    held.add(rid)
        return held

    # --- lane purge ------------------------------------------------------------------

    async def lane_depths(self, model: str, lanes: Sequence[str]) -> dict[str, int]:
        """Entries on each of these lanes (one round trip): what a purge would look at."""
        if self._lanes is None:
            raise ConfigError("lane purge needs Redis Streams: Kafka cannot delete records "
                              "from a topic (cancel the request IDs instead: batchfleet cancel)")
        k = (await self._shard_counts([model]))[model]
        pipe = self._lanes.pipeline(transaction=False)
        for lane in lanes:
            for stream in self._names.shard_streams(model, lane, k):
                pipe.xlen(stream)
        with wrap_errors(TransportError, f"cannot read {model}'s lanes"):
            lengths = [int(n) for n in await pipe.execute()]
        return {lane: sum(lengths[i * k:(i + 1) * k]) for i, lane in enumerate(lanes)}

    async def _shard_counts(self, models: Sequence[str]) -> dict[str, int]:
        """How many shard streams each model's lanes may hold work on (sharded lanes)."""
        return await RedisModelRegistry(self._store.redis, self._names).consumed_shards(models)

    async def _shard_streams(self, models: Sequence[str], lanes: Sequence[str]) -> list[str]:
        counts = await self._shard_counts(models)
        return [stream for m in models for lane in lanes
                for stream in self._names.shard_streams(m, lane, counts[m])]

    async def purge_lane(self, model: str, lane: str) -> PurgeReport:
        """Empty one lane: ``cancelled`` for every entry no worker holds, then delete it.

        Page by page, results first and deletes after: a crash in between leaves entries
        whose results are already ``cancelled`` (a worker that runs one loses its write),
        and a second purge finishes the job."""
        if self._lanes is None:
            raise ConfigError("lane purge needs Redis Streams: Kafka cannot delete records "
                              "from a topic (cancel the request IDs instead: batchfleet cancel)")
        report = PurgeReport(model)
        for stream in await self._shard_streams([model], [lane]):
            await self._purge_stream(model, lane, stream, report)
        return report

    async def _purge_stream(self, model: str, lane: str, stream: str, report: PurgeReport
                            ) -> None:
        assert self._lanes is not None  # purge_lane refused Kafka
        group = self._names.consumer_group
        cursor = "-"
        while True:
            with wrap_errors(TransportError, f"cannot read lane {model}/{lane}"):
                page: list[Any] = list(await self._lanes.xrange(stream, cursor, "+", PAGE)
                                       or ())
                if not page:
                    return
                first, last = page[0][0], page[-1][0]
                try:
                    held = {p["message_id"] for p in await self._lanes.xpending_range(
                        stream, group, first, last, len(page))}
                except ResponseError:  # no group yet: no worker ever held anything
                    held = set()
            cursor = "(" + _text(last)
            free = [(eid, fields) for eid, fields in page if eid not in held]
            report.held += len(page) - len(free)
            await self._purge_page(model, lane, free, report)
            if free:
                with wrap_errors(TransportError, f"cannot delete from lane {model}/{lane}"):
                    await self._lanes.xdel(stream, *[eid for eid, _ in free])

    async def _purge_page(self, model: str, lane: str, entries: Sequence[tuple[Any, Any]],
                          report: PurgeReport) -> None:
        now = time.time()
        writes: list[TerminalWrite] = []
        broken: list[Undecodable] = []
        for _, fields in entries:
            payload = (fields or {}).get(PAYLOAD_FIELD, b"")
            found = _purged_write(payload, model, now)
            if isinstance(found, Undecodable):
                broken.append(Undecodable(payload, found.reason, f"{model}/{lane}"))
            else:
                writes.append(found)
        won = await self._store.write_terminal(writes)
        report.cancelled += [w.request_id for w, ok in zip(writes, won, strict=True) if ok]
        report.dropped += won.count(False)
        if broken:
            await self._undecodable.add(broken)
            report.undecodable += len(broken)


def _purged_write(payload: bytes, model: str, now: float) -> TerminalWrite | Undecodable:
    """The ``cancelled`` write for one purged entry, or why it has no readable ID."""
    try:
        header = decode_request_header(payload)
        rid, raw = header.request_id, dict(header.raw)
    except DecodeError as exc:
        if exc.request_id is None:
            return Undecodable(payload, f"purged: {exc}", model)
        rid, raw = exc.request_id, dict(exc.peeked)
    gen = lua_exact_generation(raw.get("generation"))
    enqueued = raw.get("enqueued_at")
    owner = raw.get("owner")
    res = Result(rid, "cancelled", error=PURGED, model=model, finished_at=now, generation=gen,
                 enqueued_at=float(enqueued) if isinstance(enqueued, int | float) else 0.0,
                 owner=owner if isinstance(owner, str) and len(owner) <= 128 else None)
    notify = raw.get("notify")
    return TerminalWrite(rid, "cancelled", encode_result(res),
                         notify if isinstance(notify, str) and notify else None, gen)


def _pending_result(request_id: str, body: bytes | None) -> Result:
    """The pending record's envelope (model, owner, enqueue time), or a bare one."""
    if body:
        try:
            return decode_result(body)
        except DecodeError:
            pass
    return Result(request_id, "pending")


def _cancelled(pending: Result, generation: int, error: ErrorInfo) -> Result:
    return Result(pending.request_id, "cancelled", error=error, model=pending.model,
                  enqueued_at=pending.enqueued_at, finished_at=time.time(),
                  generation=generation, owner=pending.owner)


def _peek_id(payload: bytes) -> str | None:
    rid = peek_header(payload).get("id")
    return rid if isinstance(rid, str) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_request_control(broker: BrokerURL, store: ResultStore) -> RequestControl:
    """Request control over an open store; on Redis Streams with a client of the broker's
    Redis of its own (closed with it)."""
    from batchfleet.connectors.redis_client import redis_client

    return RequestControl(store, redis_client(broker.url) if broker.kind == "redis" else None)
