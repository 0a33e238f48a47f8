"""A batch's results written and its messages acked in one round trip, when the result
store and the streams share one Redis.

The general path makes two calls per batch: the first-wins terminal write on the result
store, then ``XACK`` + ``XDEL`` on the broker, because the two may be different servers
(or a cluster, or Kafka). When they are the same single node, one script does both, in
that order: the ack runs only once every write in the call has landed, inside the same
atomic script. That also closes the two-call path's window between the two (stored but
not yet acked, where a crash means a redelivery that first-wins absorbs). A worker's
loop sleeps and wakes once per round trip, and on a small machine the wake-up costs more
CPU than the command (docs/performance.md).

A retry after a lost reply runs the script again: the writes are first-wins (they report
"lost" the second time, as a redelivery's would) and acking or deleting an entry twice
does nothing, so the call is idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_streams import ACK_DEL_FN, entries_by_stream
from batchfleet.connectors.result_store import (
    MAX_INDEXED,
    WRITE_TERMINAL_BODY,
    ResultStore,
)
from batchfleet.connectors.values import TerminalWrite
from batchfleet.schemas.errors import ResultStoreError

#: After the terminal write's own arguments (``_WRITE_TERMINAL``: 5, the N bodies, one
#: announcement per channel): the consumer group, then per stream its name, its count of
#: entry IDs and the IDs. Undeclared keys are fine on the single node this runs on.
_ACK_TAIL = ACK_DEL_FN + """
local a = 6 + n + #channels
local group = ARGV[a]
a = a + 1
while a <= #ARGV do
  local last = a + 1 + tonumber(ARGV[a + 1])
  ack_del(ARGV[a], group, a + 2, last)
  a = last + 1
end
return out
"""
_WRITE_AND_ACK = WRITE_TERMINAL_BODY + _ACK_TAIL


class OneTripFinish:
    """Writes a batch's terminal results and acks its deliveries in one script call."""

    def __init__(self, store: ResultStore, group: str) -> None:
        self._store = store
        self._group = group
        self._write_and_ack = store.redis.register_script(_WRITE_AND_ACK)

    async def write_and_ack(self, writes: Sequence[TerminalWrite],
                            deliveries: Sequence[Delivery]) -> list[bool]:
        """Store ``writes`` (first wins, as ``ResultStore.write_terminal``), then ack and
        delete ``deliveries``; True where this call's write won."""
        if len(writes) > MAX_INDEXED:  # two bytes index the kinds: the rest goes first
            won = await self._store.write_terminal(writes[:-MAX_INDEXED])
            return won + await self.write_and_ack(writes[-MAX_INDEXED:], deliveries)
        keys, args = self._store.terminal_call(writes)
        args.append(self._group)
        for stream, ids in entries_by_stream(deliveries).items():
            args.extend((stream, len(ids), *ids))
        with wrap_errors(ResultStoreError, "cannot write results"):
            won = await self._write_and_ack(keys=keys, args=args)
        return [bool(x) for x in won]
