"""The result store: one Redis hash per request ID, first terminal result wins.

Each record is a hash ``{status, gen, body}`` where ``body`` is the encoded
result envelope. Writes go through Lua so that "write only if not yet
terminal" is atomic, and a whole batch is one round trip. A terminal write
also publishes the finished results themselves, IDs and bodies, grouped per
client channel: a waiting client has its answer in one hop, without reading it
back. One PUBLISH per client per batch, sent only for writes that won, after
they are stored: the write is the commit point, the message only a delivery.

``gen`` is the request's generation: a DLQ replay raises it and resets the
record to ``pending``; a write from an older generation never lands.

``owner`` (the API key ID) and ``fp`` (an idempotent gateway submit's
fingerprint) are set with the pending record and never change: the gateway
answers reads by owner, and the terminal write frees the owner's in-flight
quota slot (connectors/quotas.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.log_claims import CLAIM_SCRIPT, claim_args, claims_from
from batchfleet.connectors.redis_pressure import RedisPressure, read_pressure
from batchfleet.connectors.values import (
    DEFAULT_TTL_S,
    CancelView,
    DeliveryCount,
    LogClaim,
    Ownership,
    StoredRecord,
    SubmitState,
    TerminalWrite,
)
from batchfleet.schemas.envelopes import NOTIFY_RESULTS
from batchfleet.schemas.errors import ResultStoreError, TransportError
from batchfleet.schemas.names import Names

# The script texts with public names are shared: the Redis Cluster store
# (``connectors/cluster_store.py``) runs the same text once per slot group.

#: One record's pending write (a ``SubmitState``), shared with the one-round-trip submit
#: (``connectors.redis_submit``). ``meta`` is (owner, fingerprint, notify client), '' for
#: none. A fingerprint (an idempotent gateway submit's model and body, or an SDK submit's
#: model and inputs under a caller-chosen ID) that differs from the stored one is a
#: conflict (3); a record stored without one (its ID was made by the SDK) matches any.
PUT_PENDING_FN = """
local function put_pending(key, ttl, meta, body)
  local owner, fp, notify = meta[1], meta[2], meta[3]
  if redis.call('HSETNX', key, 'status', 'pending') == 1 then
    -- one HSET for every field: a redis.call costs Redis about as much as the write itself
    if owner == '' and fp == '' then  -- the SDK's own IDs: no table to build
      if notify and notify ~= '' then
        redis.call('HSET', key, 'gen', 0, 'body', body, 'notify', notify)
      else
        redis.call('HSET', key, 'gen', 0, 'body', body)
      end
    else
      local f = {'gen', 0, 'body', body}
      if owner ~= '' then f[#f + 1] = 'owner'; f[#f + 1] = owner end
      if notify and notify ~= '' then f[#f + 1] = 'notify'; f[#f + 1] = notify end
      if fp ~= '' then f[#f + 1] = 'fp'; f[#f + 1] = fp end
      redis.call('HSET', key, unpack(f))
    end
    redis.call('EXPIRE', key, ttl)
    return 0
  elseif fp ~= '' and (redis.call('HGET', key, 'fp') or fp) ~= fp then
    return 3
  elseif redis.call('HGET', key, 'status') == 'pending' then
    return 1
  end
  return 2
end
"""

#: Requests per script call at most where each carries a two-byte index into the call's
#: distinct metadata tuples (the one-trip submit and the terminal write): sent once
#: each, not once per request, since unpacking a tuple per request cost Redis more than
#: the write it describes.
MAX_INDEXED = 65_535

#: The tuple a request's two-byte index (in ``codes``, big-endian) names, 1-based.
INDEXED_FN = """
local function indexed(tuples, codes, i)
  local hi, lo = string.byte(codes, 2 * i - 1, 2 * i)
  return tuples[hi * 256 + lo]
end
"""


def pack_indexes(numbers: Sequence[int]) -> bytes:
    """What ``INDEXED_FN`` reads: each number as two bytes, big-endian."""
    return struct.pack(f">{len(numbers)}H", *numbers)


#: ARGV[2] packs each key's ``meta``.
PUT_PENDING_SCRIPT = PUT_PENDING_FN + """
local ttl = tonumber(ARGV[1])
local meta = cmsgpack.unpack(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do out[i] = put_pending(key, ttl, meta[i], ARGV[i + 2]) end
return out
"""

#: ARGV[1] the TTL; ARGV[2] msgpack of [kinds, channels]: the distinct (status, channel
#: index, gen, pairs wanted) tuples and the channel names (index 0: no channel); ARGV[3]
#: each write's 1-based index into the kinds (two bytes, big-endian); ARGV[4] the in-flight
#: key prefix (a won write frees the owner's quota slot, connectors/quotas.py, so workers
#: need not know about quotas); ARGV[5] the length of the result keys' prefix (the request
#: ID is the rest of its key); then the N bodies; then per channel, the announcement of
#: its ``notify_format`` results as the caller built it (or ''), sent as is when every
#: write in it won. Each client channel gets one message per format its requests asked
#: for (docs/wire-format.md §8): a msgpack array alternating request ID and result body,
#: or the IDs comma-joined (every other request: what clients before one-hop delivery
#: read). Building the array here, and unpacking a tuple per write, cost Redis more than
#: the writes; the caller's msgpack does both in C. A write that lost is left out of its
#: channel's message, which is then rebuilt from the winners (rare: a redelivery).
#: ``WRITE_TERMINAL_BODY`` leaves ``out`` (1 where the write won) for its caller to
#: return: ``connectors.redis_finish`` appends the batch's ack first.
WRITE_TERMINAL_BODY = INDEXED_FN + """
-- msgpack headers by hand: cmsgpack would send bodies as str, not bin
local function u16(n) return string.char(math.floor(n / 256), n % 256) end
local function u32(n) return string.char(math.floor(n / 16777216), math.floor(n / 65536) % 256,
                                         math.floor(n / 256) % 256, n % 256) end
local function str_h(n) if n < 32 then return string.char(0xa0 + n) end
  return string.char(0xd9, n) end  -- request IDs are at most 128 bytes
local function bin_h(n) if n < 256 then return string.char(0xc4, n) end
  if n < 65536 then return string.char(0xc5) .. u16(n) end
  return string.char(0xc6) .. u32(n) end
local function array_h(n) if n < 16 then return string.char(0x90 + n) end
  if n < 65536 then return string.char(0xdc) .. u16(n) end
  return string.char(0xdd) .. u32(n) end
local ttl = tonumber(ARGV[1])
local meta = cmsgpack.unpack(ARGV[2])
local kinds, channels = meta[1], meta[2]
local codes, inflight, plen = ARGV[3], ARGV[4], tonumber(ARGV[5])
local n = #KEYS
local out = {}
local lost = {}
local id_lists = {}
for i, key in ipairs(KEYS) do
  local kind = indexed(kinds, codes, i)
  local status, ci, gen = kind[1], kind[2], kind[3]
  local cur = redis.call('HMGET', key, 'status', 'gen', 'owner')
  local cur_gen = tonumber(cur[2]) or 0
  if (not cur[1] or cur[1] == 'pending') and gen >= cur_gen then
    redis.call('HSET', key, 'status', status, 'gen', gen, 'body', ARGV[5 + i])
    redis.call('EXPIRE', key, ttl)
    if cur[3] then redis.call('ZREM', inflight .. cur[3], string.sub(key, plen + 1)) end
    out[i] = 1
    if ci > 0 and kind[4] ~= 1 then
      local ids = id_lists[ci]
      if not ids then ids = {}; id_lists[ci] = ids end
      ids[#ids + 1] = string.sub(key, plen + 1)
    end
  else
    out[i] = 0
    if ci > 0 and kind[4] == 1 then lost[ci] = true end
  end
end
for ci, channel in ipairs(channels) do
  local built = ARGV[5 + n + ci]
  if built ~= '' and not lost[ci] then
    redis.call('PUBLISH', channel, built)
  elseif built ~= '' then
    local parts = {}
    for i, key in ipairs(KEYS) do
      local kind = indexed(kinds, codes, i)
      if out[i] == 1 and kind[2] == ci and kind[4] == 1 then
        local rid, body = string.sub(key, plen + 1), ARGV[5 + i]
        parts[#parts + 1] = str_h(#rid) .. rid
        parts[#parts + 1] = bin_h(#body)
        parts[#parts + 1] = body
      end
    end
    if #parts > 0 then
      redis.call('PUBLISH', channel, array_h(#parts / 3 * 2) .. table.concat(parts))
    end
  end
end
for ci, ids in pairs(id_lists) do
  redis.call('PUBLISH', channels[ci], table.concat(ids, ','))
end
"""
_WRITE_TERMINAL = WRITE_TERMINAL_BODY + "return out\n"

#: ARGV[i + 1] < 0: only read (a first delivery that needs its generation checked).
COUNT_DELIVERIES_SCRIPT = """
local ttl = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local before = tonumber(ARGV[i + 1])
  -- one read and at most one write a key: each redis.call costs about what its work does
  local cur = redis.call('HMGET', key, 'deliveries', 'solo', 'status', 'gen')
  local n = tonumber(cur[1]) or 0
  if before >= 0 then
    n = math.max(n, before) + 1
    redis.call('HSET', key, 'deliveries', n)
    -- every writer of these fields sets the TTL, so only a record new here lacks one
    if not (cur[1] or cur[2] or cur[3] or cur[4]) then redis.call('EXPIRE', key, ttl) end
  end
  local gen = tonumber(cur[4]) or 0
  local done = -1
  if cur[3] and cur[3] ~= 'pending' then done = gen end
  out[i] = {n, tonumber(cur[2]) or 0, done, gen}
end
return out
"""

#: ARGV[1] = '1': return a body only where the status is terminal (else nil).
GET_BODIES_SCRIPT = """
local terminal_only = ARGV[1] == '1'
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'body')
  if terminal_only and (not cur[1] or cur[1] == 'pending') then out[i] = false
  else out[i] = cur[2] end
end
return out
"""

#: Per key: 1 where a record exists, 0 where none does (``missing``). One reply to parse
#: instead of a pipeline of ``EXISTS``: 2,000 absent IDs cost the client 15 ms that way.
EXISTS_EACH_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('EXISTS', key) end
return out
"""

#: Per key: {status, owner, fingerprint[, body]}, false for a missing record.
GET_RECORDS_SCRIPT = """
local with_body = ARGV[1] == '1'
local out = {}
for i, key in ipairs(KEYS) do
  local cur
  if with_body then cur = redis.call('HMGET', key, 'status', 'owner', 'fp', 'body')
  else cur = redis.call('HMGET', key, 'status', 'owner', 'fp') end
  if cur[1] then out[i] = cur else out[i] = false end
end
return out
"""

REOPEN_SCRIPT = """
local DEGRADED_MARK = '\\168degraded\\195'
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'gen', 'body')
  -- a degraded success (a fallback answered) reopens too: its request is in the DLQ for a
  -- real answer. Its map starts with the packed pair "degraded": true, after a fixmap's
  -- 1 header byte or a map16's 3 (values.py::degraded_body; docs/degradation.md).
  if cur[1] == 'failed' or cur[1] == 'pending' or (cur[1] == 'succeeded' and cur[3]
      and (string.sub(cur[3], 2, 11) == DEGRADED_MARK
           or string.sub(cur[3], 4, 13) == DEGRADED_MARK)) then
    local gen = (tonumber(cur[2]) or 0) + 1
    redis.call('HSET', key, 'status', 'pending', 'gen', gen, 'deliveries', 0, 'solo', 0,
      'stalls', 0, 'body', ARGV[i])
    out[i] = gen
  else
    out[i] = -1
  end
end
return out
"""


#: One more stall of one record. A record gone (expired, or never written: a first delivery
#: only reads) is created, so its count holds, but with the TTL (a bare HINCRBY would keep
#: it forever). ARGV: ttl.
NOTE_STALL_SCRIPT = """
local n = redis.call('HINCRBY', KEYS[1], 'stalls', 1)
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
"""

#: ARGV: ttl, solo delta, deliveries to set ('' for none); a TTL as in NOTE_STALL_SCRIPT.
MARK_SOLO_SCRIPT = """
redis.call('HINCRBY', KEYS[1], 'solo', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'deliveries', ARGV[3]) end
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return 1
"""


#: Per key: {status, gen, notify, body}, false for a missing record (what a cancel needs).
CANCEL_VIEWS_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'gen', 'notify', 'body')
  if cur[1] then out[i] = cur else out[i] = false end
end
return out
"""


#: Lane losses only move forward: a late heartbeat never replaces a later loss with an
#: earlier one. ARGV: ttl, then (field, epoch ms) pairs.
_MARK_LANE_LOSSES = """
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


#: Undo a submit whose publish failed: delete records still ``pending`` at generation 0
#: with no delivery counted, so a retry (same ID) starts afresh instead of finding a
#: record that no message will ever answer.
WITHDRAW_SCRIPT = """
local n = 0
for _, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'gen', 'deliveries')
  if cur[1] == 'pending' and (tonumber(cur[2]) or 0) == 0 and
     (tonumber(cur[3]) or 0) == 0 then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"""


def terminal_meta(writes: Sequence[TerminalWrite], channel_of: Callable[[str], str]
                  ) -> tuple[dict[tuple[str, int, int, int], int], list[str], bytes,
                             list[bytes]]:
    """``_WRITE_TERMINAL``'s arguments beside the keys and bodies: the distinct (status,
    channel index, generation, pairs wanted) kinds, numbered from 1; the channel names,
    in index order; each write's kind number (two bytes); and per channel, the message
    announcing its ``notify_format`` results, or b"" where none asked for them."""
    kinds: dict[tuple[str, int, int, int], int] = {}
    clients: dict[str, int] = {}
    flat: dict[int, list[str | bytes]] = {}
    numbers: list[int] = []
    for w in writes:
        index = clients.setdefault(w.notify_channel, len(clients) + 1) if w.notify_channel else 0
        pairs = int(w.notify_format == NOTIFY_RESULTS)
        if index and pairs:
            flat.setdefault(index, []).extend((w.request_id, w.body))
        numbers.append(kinds.setdefault((w.status, index, w.generation, pairs), len(kinds) + 1))
    announcements = [msgpack.packb(flat[i]) if i in flat else b""
                     for i in range(1, len(clients) + 1)]
    return kinds, [channel_of(c) for c in clients], pack_indexes(numbers), announcements


class ResultStore:
    """Redis-backed result store keyed by request ID."""

    def __init__(self, client: aioredis.Redis, names: Names, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._redis = client
        self._names = names
        self.ttl_s = ttl_s
        self._put_pending = client.register_script(PUT_PENDING_SCRIPT)
        self._write_terminal = client.register_script(_WRITE_TERMINAL)
        self._count_deliveries = client.register_script(COUNT_DELIVERIES_SCRIPT)
        self._reopen = client.register_script(REOPEN_SCRIPT)
        self._mark_solo = client.register_script(MARK_SOLO_SCRIPT)
        self._get_bodies = client.register_script(GET_BODIES_SCRIPT)
        self._mark_losses = client.register_script(_MARK_LANE_LOSSES)
        self._withdraw = client.register_script(WITHDRAW_SCRIPT)
        self._get_records = client.register_script(GET_RECORDS_SCRIPT)
        self._exists_each = client.register_script(EXISTS_EACH_SCRIPT)
        self._cancel_views = client.register_script(CANCEL_VIEWS_SCRIPT)
        self._claim = client.register_script(CLAIM_SCRIPT)
        self._inflight_prefix = names.inflight_prefix
        #: Where the request ID starts in a result key: one node's keys are a fixed prefix
        #: and the ID (the cluster store, whose keys carry a tag, has its own write).
        self._id_offset = len(names.result(""))

    @property
    def redis(self) -> aioredis.Redis:
        """The client, for other seams over the same pool (``connectors.redis_plane``) and
        tests; never used above ``connectors``."""
        return self._redis

    @property
    def names(self) -> Names:
        return self._names

    async def put_pending(self, records: Sequence[tuple[str, bytes]],
                          owners: Sequence[Ownership] | None = None) -> list[SubmitState]:
        """Create ``pending`` records for (request ID, pending body) pairs, never overwriting;
        ``owners`` (one per record) stamps who submitted each, and what, in the record."""
        if not records:
            return []
        keys = [self._names.result(rid) for rid, _ in records]
        meta = msgpack.packb([(o.owner or "", o.fingerprint or "", o.notify or "")
                              for o in owners]
                             if owners is not None else [("", "", "")] * len(records))
        args: list[Any] = [self.ttl_s, meta, *(body for _, body in records)]
        with wrap_errors(ResultStoreError, "cannot record pending requests"):
            states = await self._put_pending(keys=keys, args=args)
        return [SubmitState(int(s)) for s in states]

    async def write_terminal(self, writes: Sequence[TerminalWrite]) -> list[bool]:
        """Store terminal results unless one already exists; True where this call's write won."""
        if not writes:
            return []
        if len(writes) > MAX_INDEXED:  # two bytes index the kinds
            return [won for start in range(0, len(writes), MAX_INDEXED)
                    for won in await self.write_terminal(writes[start:start + MAX_INDEXED])]
        keys, args = self.terminal_call(writes)
        with wrap_errors(ResultStoreError, "cannot write results"):
            won = await self._write_terminal(keys=keys, args=args)
        return [bool(x) for x in won]

    def terminal_call(self, writes: Sequence[TerminalWrite]) -> tuple[list[str], list[Any]]:
        """``WRITE_TERMINAL_BODY``'s keys and arguments for at most ``MAX_INDEXED`` writes."""
        result_key = self._names.result
        keys = [result_key(w.request_id) for w in writes]
        kinds, channels, codes, announcements = terminal_meta(writes,
                                                              self._names.notify_channel)
        args: list[Any] = [self.ttl_s, msgpack.packb((list(kinds), channels)), codes,
                           self._inflight_prefix, self._id_offset,
                           *(w.body for w in writes), *announcements]
        return keys, args

    async def count_deliveries(self, counted: Sequence[tuple[str, int]]
                               ) -> list[DeliveryCount]:
        """Durably count one more delivery of each request, and read its record.

        ``counted`` pairs each request ID with the deliveries known to have happened
        before this one (the count becomes at least that plus one): a transport that
        can tell a first delivery apart (Redis) skips counting those, and says so
        here when the request comes round again. A negative ``before`` only reads:
        a first delivery of a retry or a replay is checked for staleness, not counted.

        Kept in the result record itself. More deliveries than attempts means a
        worker died holding the request; ``solo`` counts its solo runs that never
        finished (see :meth:`mark_solo`), so a request that kills every worker that
        computes it can be quarantined instead of looping forever, without blaming
        the neighbours that merely shared a batch or a buffer with it.
        """
        if not counted:
            return []
        keys = [self._names.result(rid) for rid, _ in counted]
        with wrap_errors(ResultStoreError, "cannot count deliveries"):
            rows = await self._count_deliveries(
                keys=keys, args=[self.ttl_s, *(before for _, before in counted)])
        return [DeliveryCount(int(n), int(solo), int(done), int(gen))
                for n, solo, done, gen in rows]

    async def mark_solo(self, request_id: str, started: bool, attempt: int = 1) -> None:
        """Count a suspect's solo run durably *before* it computes, and uncount it after:
        what remains counts only the runs during which the worker died. A finished solo
        run also clears the suspicion: deliveries go back to one per attempt so far."""
        key = self._names.result(request_id)
        args = [self.ttl_s, *([1, ""] if started else [-1, attempt])]
        with wrap_errors(ResultStoreError, "cannot record a solo run"):
            await self._mark_solo(keys=[key], args=args)

    async def note_stalls(self, request_ids: Sequence[str]) -> list[int]:
        """Count one more compute stall of each request durably; returns each one's count.

        A stall is a batch that overran its compute limit. Kept in the result record so a
        request implicated twice is quarantined whichever workers saw it stall
        (``workers.containment``). One non-transactional pipeline: each key is its own.
        A record gone is created with the store's TTL, never one that outlives it."""
        if not request_ids:
            return []
        with wrap_errors(ResultStoreError, "cannot record compute stalls"):
            pipe = self._redis.pipeline(transaction=False)
            for rid in request_ids:
                pipe.eval(NOTE_STALL_SCRIPT, 1, self._names.result(rid), self.ttl_s)
            return [int(n) for n in await pipe.execute()]

    async def reopen_for_replay(self, records: Sequence[tuple[str, bytes]]) -> list[int]:
        """Turn ``failed`` records back to ``pending`` under a new generation, for DLQ replay.

        ``pending`` is reopened too: it means an earlier replay stopped before it
        published, and so is a degraded success (a fallback answered; ``reopenable``).
        Returns the new generation per request, or -1 where the record is succeeded
        (by the model), expired or gone: those are not replayed. A late write from the
        old generation can then never land (see _WRITE_TERMINAL).
        """
        if not records:
            return []
        keys = [self._names.result(rid) for rid, _ in records]
        with wrap_errors(ResultStoreError, "cannot reopen results for replay"):
            return [int(g) for g in await self._reopen(keys=keys, args=[b for _, b in records])]

    async def get_bodies(self, request_ids: Sequence[str], terminal_only: bool = False
                         ) -> list[bytes | None]:
        """Encoded result envelopes in one round trip; None if unknown, and with
        ``terminal_only`` also None while pending (a waiter would only decode a pending
        body to throw it away).

        One script call rather than a pipeline of HGETs: one command to pack and one
        reply to parse, however many IDs (redis-py's per-reply cost dominated).
        """
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            bodies = await self._get_bodies(keys=keys, args=[int(terminal_only)])
        return [b or None for b in bodies]

    async def get_records(self, request_ids: Sequence[str], with_body: bool = False
                          ) -> list[StoredRecord | None]:
        """Owner, fingerprint and status (and the body) of each record in one round trip, so
        the gateway can refuse another key's request before it decodes or waits on it."""
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            rows = await self._get_records(keys=keys, args=[int(with_body)])
        return [None if not row else StoredRecord(
            text_or_none(row[0]) or "", text_or_none(row[1]), text_or_none(row[2]),
            (row[3] or None) if with_body else None) for row in rows]

    async def cancel_views(self, request_ids: Sequence[str]) -> list[CancelView | None]:
        """Status, generation, client and body of each record, in one round trip: what
        ``connectors.request_control`` needs to write a ``cancelled`` result in its place
        (through :meth:`write_terminal`, so the first terminal result still wins)."""
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            rows = await self._cancel_views(keys=keys)
        return [None if not row else CancelView(
            text_or_none(row[0]) or "", int(row[1] or 0), text_or_none(row[2]) or None,
            row[3] or None)
            for row in rows]

    async def withdraw_pending(self, request_ids: Sequence[str]) -> int:
        """Delete the ``pending`` records a failed submit just created (see ``WITHDRAW_SCRIPT``)."""
        if not request_ids:
            return 0
        with wrap_errors(ResultStoreError, "cannot withdraw pending records"):
            return int(await self._withdraw(
                keys=[self._names.result(rid) for rid in request_ids]))

    async def mark_lane_losses(self, losses: Mapping[str, int]) -> None:
        """Record lanes recreated after a loss (``{model}:{lane}`` -> epoch ms); kept as
        long as results, since no record it concerns outlives that."""
        if not losses:
            return
        args: list[Any] = [self.ttl_s]
        for lane, ms in losses.items():
            args += [lane, int(ms)]
        with wrap_errors(ResultStoreError, "cannot record a lane loss"):
            await self._mark_losses(keys=[self._names.lane_loss], args=args)

    async def claim_positions(self, claims: Sequence[tuple[str, int, int]]
                              ) -> list[LogClaim]:
        """Raise each ordered log's claim to ``(log, offset, timestamp_ms)`` before its
        records run; returns what each had handed out before (``connectors.log_claims``)."""
        if not claims:
            return []
        with wrap_errors(ResultStoreError, "cannot claim log positions"):
            rows = await self._claim(keys=[self._names.log_claims],
                                     args=claim_args(self.ttl_s, claims))
        return claims_from(rows)

    async def lane_losses(self) -> dict[str, int]:
        """``{model}:{lane}`` -> epoch ms before which that lane's queued requests were lost."""
        with wrap_errors(ResultStoreError, "cannot read lane losses"):
            raw = await self._redis.hgetall(self._names.lane_loss)
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}

    async def missing(self, request_ids: Sequence[str]) -> list[str]:
        """The IDs without a record. One ``EXISTS`` of them all answers the usual case
        (none missing) with one integer; only then is each looked at, in one script."""
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            if int(await self._redis.exists(*keys)) == len(keys):
                return []
            found = await self._exists_each(keys=keys)
        return [rid for rid, there in zip(request_ids, found, strict=True) if not there]

    async def pressure(self) -> RedisPressure:
        """Memory against ``maxmemory`` and the eviction policy (admission, readiness)."""
        try:
            return await read_pressure(self._redis, self._names)
        except TransportError as exc:
            raise ResultStoreError(str(exc)) from exc

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        with wrap_errors(ResultStoreError, "cannot close the result store"):
            await self._redis.aclose()


def text_or_none(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
