"""A submit in one round trip, when the result store and the streams share one Redis.

The general path makes two calls per chunk: ``put_pending`` on the result store, then
XADD on the broker, because the two may be different servers (or a cluster). When
they are the same single node, one script does both: it records each request's pending
record and XADDs those it found new or still pending, which halves the round trips
and the client CPU of a submit that goes out alone (one ``submit()`` per arrival).

A failed XADD (a stream key of the wrong type, say) removes the records this call
created before the script fails, so a retry with the same ID is a fresh submit, as
on the two-call path. Redis runs a script atomically and, once it has written, past
``maxmemory`` too, so no other client sees a record without its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from batchfleet.connectors.broker import OutboundMessage
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.result_store import (
    INDEXED_FN,
    MAX_INDEXED,
    PUT_PENDING_FN,
    ResultStore,
    pack_indexes,
)
from batchfleet.connectors.values import Ownership, SubmitState
from batchfleet.schemas.errors import TransportError
from batchfleet.schemas.names import shard_for

#: KEYS: the N result keys, then the streams. ARGV[1] the TTL, ARGV[2] the MAXLEN (0:
#: none), ARGV[3] msgpack of the distinct (owner, fingerprint, notify, stream index)
#: tuples, ARGV[4] each request's 1-based index into them (two bytes, big-endian), then
#: N pending bodies and N request payloads (field 'p', as ``RedisStreamsPublisher``).
#: The tuples go once each (``INDEXED_FN``): a chunk of one client's requests has one.
_SUBMIT = PUT_PENDING_FN + INDEXED_FN + """
local ttl, maxlen = tonumber(ARGV[1]), tonumber(ARGV[2])
local kinds, codes = cmsgpack.unpack(ARGV[3]), ARGV[4]
local n = #codes / 2
local out, created = {}, {}
for i = 1, n do
  local meta = indexed(kinds, codes, i)
  local state = put_pending(KEYS[i], ttl, meta, ARGV[4 + i])
  out[i] = state
  if state == 0 then created[#created + 1] = KEYS[i] end
  if state <= 1 then
    local stream, payload = KEYS[n + meta[4]], ARGV[4 + n + i]
    local added
    if maxlen > 0 then
      added = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'p', payload)
    else
      added = redis.pcall('XADD', stream, '*', 'p', payload)
    end
    if type(added) == 'table' and added.err then
      for _, key in ipairs(created) do redis.call('DEL', key) end
      return redis.error_reply(added.err)
    end
  end
end
return out
"""


class OneTripSubmit:
    """Records and publishes a chunk of requests in one script call (one node only)."""

    def __init__(self, store: ResultStore, max_stream_len: int | None = None) -> None:
        self._store = store
        self._names = store.names
        self._max_len = max_stream_len or 0
        self._submit = store.redis.register_script(_SUBMIT)

    async def submit(self, records: Sequence[tuple[str, bytes]], owners: Sequence[Ownership],
                     messages: Sequence[OutboundMessage]) -> list[SubmitState]:
        """``records``, ``owners`` and ``messages`` are parallel: one of each per request.
        Publishes the requests whose state is NEW or PENDING, exactly as the two-call
        path does; raises ``TransportError`` with nothing recorded if any XADD fails."""
        if len(records) > MAX_INDEXED:  # two bytes index the tuples
            return [state for start in range(0, len(records), MAX_INDEXED)
                    for state in await self.submit(records[start:start + MAX_INDEXED],
                                                   owners[start:start + MAX_INDEXED],
                                                   messages[start:start + MAX_INDEXED])]
        names = self._names
        streams: dict[str, int] = {}
        kinds: dict[tuple[str, str, str, int], int] = {}
        numbers: list[int] = []
        for o, msg in zip(owners, messages, strict=True):
            stream = names.stream(msg.model, msg.lane, shard_for(msg.key, msg.shards))
            index = streams.setdefault(stream, len(streams) + 1)
            kind = (o.owner or "", o.fingerprint or "", o.notify or "", index)
            numbers.append(kinds.setdefault(kind, len(kinds) + 1))
        keys = [names.result(rid) for rid, _ in records]
        args: list[Any] = [self._store.ttl_s, self._max_len, msgpack.packb(list(kinds)),
                           pack_indexes(numbers)]
        args.extend(body for _, body in records)
        args.extend(msg.payload for msg in messages)
        with wrap_errors(TransportError, "cannot submit to Redis"):
            states = await self._submit(keys=[*keys, *streams], args=args)
        return [SubmitState(int(s)) for s in states]
