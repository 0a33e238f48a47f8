"""The result store on Redis Cluster: the same scripts, one call per slot, pipelined per node.

A Lua script may only touch keys of one hash slot. Result records carry one of
``RESULT_TAGS`` hash tags (``schemas/names.py``), so a batch's records fall into a
few slot groups: each group is one script call, and the calls go out in one
``RedisCluster`` pipeline, which sends one round trip per node, not one per request.

Scripts run with ``EVAL`` (the text), not ``EVALSHA``: the script cache is per node,
and a replica promoted by a failover starts with it empty. The text is a few KB
per slot group, small beside the bodies, and the server caches the compiled script.

The terminal write cannot free the owner's in-flight quota slot or publish inside
its script (both live in other slots), so on a cluster those are a second
pipelined step right after the commit write: ``ZREM`` on the owner's in-flight set
and one ``SPUBLISH`` per client channel (sharded pub/sub), bodies included. A
crash between the two steps loses only announcements (the waiter's poll finds the
result) and leaves in-flight entries to expire with their score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.crc import key_slot

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.redis_client import is_cluster
from batchfleet.connectors.result_store import (
    CANCEL_VIEWS_SCRIPT,
    COUNT_DELIVERIES_SCRIPT,
    EXISTS_EACH_SCRIPT,
    GET_BODIES_SCRIPT,
    GET_RECORDS_SCRIPT,
    MARK_SOLO_SCRIPT,
    PUT_PENDING_SCRIPT,
    REOPEN_SCRIPT,
    WITHDRAW_SCRIPT,
    ResultStore,
    text_or_none,
)
from batchfleet.connectors.values import (
    DEFAULT_TTL_S,
    CancelView,
    DeliveryCount,
    Ownership,
    StoredRecord,
    SubmitState,
    TerminalWrite,
)
from batchfleet.schemas.envelopes import NOTIFY_RESULTS
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

#: The first-wins write of ``result_store._WRITE_TERMINAL`` without what lies outside the
#: slot: per key 0 (lost) or the record's owner ('' for none) where the write won.
WRITE_TERMINAL_SLOT_SCRIPT = """
local ttl = tonumber(ARGV[1])
local meta = cmsgpack.unpack(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  local status, gen, body = meta[i][1], meta[i][2], ARGV[i + 2]
  local cur = redis.call('HMGET', key, 'status', 'gen', 'owner')
  local cur_gen = tonumber(cur[2]) or 0
  if (not cur[1] or cur[1] == 'pending') and gen >= cur_gen then
    redis.call('HSET', key, 'status', status, 'gen', gen, 'body', body)
    redis.call('EXPIRE', key, ttl)
    out[i] = cur[3] or ''
  else
    out[i] = 0
  end
end
return out
"""

ArgsFor = Callable[[list[int]], list[Any]]


def slot_groups(keys: Sequence[str]) -> dict[int, list[int]]:
    """Indices of ``keys`` grouped by hash slot, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode()), []).append(i)
    return groups


async def eval_per_slot(client: aioredis.Redis, script: str, keys: Sequence[str],
                        args_for: ArgsFor) -> list[Any]:
    """Run a per-key script once per slot group, all in one pipeline; the per-key
    replies come back in ``keys`` order (the script returns one entry per KEYS)."""
    groups = list(slot_groups(keys).values())
    pipe = client.pipeline(transaction=False)
    for idx in groups:
        pipe.eval(script, len(idx), *(keys[i] for i in idx), *args_for(idx))
    # a dead primary: the pipeline re-reads the topology (redis_client.FleetPipeline)
    replies = await pipe.execute()
    out: list[Any] = [None] * len(keys)
    for idx, reply in zip(groups, replies, strict=True):
        for i, value in zip(idx, reply, strict=True):
            out[i] = value
    return out


class ClusterResultStore(ResultStore):
    """:class:`ResultStore` over a ``RedisCluster``: multi-key scripts split per slot."""

    async def put_pending(self, records: Sequence[tuple[str, bytes]],
                          owners: Sequence[Ownership] | None = None) -> list[SubmitState]:
        if not records:
            return []
        meta = [(o.owner or "", o.fingerprint or "", o.notify or "") for o in owners] \
            if owners is not None else [("", "", "")] * len(records)
        keys = [self._names.result(rid) for rid, _ in records]
        with wrap_errors(ResultStoreError, "cannot record pending requests"):
            states = await eval_per_slot(self._redis, PUT_PENDING_SCRIPT, keys, lambda idx: [
                self.ttl_s, msgpack.packb([meta[i] for i in idx]),
                *(records[i][1] for i in idx)])
        return [SubmitState(int(s)) for s in states]

    async def write_terminal(self, writes: Sequence[TerminalWrite]) -> list[bool]:
        """The first-wins write per slot group, then the in-flight ``ZREM``s and one
        ``SPUBLISH`` per client channel for the writes that won (see the module doc)."""
        if not writes:
            return []
        keys = [self._names.result(w.request_id) for w in writes]
        with wrap_errors(ResultStoreError, "cannot write results"):
            owners = await eval_per_slot(
                self._redis, WRITE_TERMINAL_SLOT_SCRIPT, keys, lambda idx: [
                    self.ttl_s, msgpack.packb([(writes[i].status, writes[i].generation)
                                               for i in idx]),
                    *(writes[i].body for i in idx)])
            won = [not isinstance(o, int) for o in owners]
            freed: dict[str, list[str]] = {}
            told: dict[str, list[Any]] = {}
            told_ids: dict[str, list[str]] = {}
            for w, owner, ok in zip(writes, owners, won, strict=True):
                if not ok:
                    continue
                if owner:
                    freed.setdefault(_str(owner), []).append(w.request_id)
                if w.notify_channel and w.notify_format == NOTIFY_RESULTS:
                    told.setdefault(self._names.notify_channel(w.notify_channel), []).extend(
                        (w.request_id, w.body))
                elif w.notify_channel:
                    told_ids.setdefault(self._names.notify_channel(w.notify_channel),
                                        []).append(w.request_id)
            if freed or told or told_ids:
                pipe = self._redis.pipeline(transaction=False)
                for owner, ids in freed.items():
                    pipe.zrem(self._inflight_prefix + owner, *ids)
                for channel, flat in told.items():
                    pipe.spublish(channel, msgpack.packb(flat, use_bin_type=True))
                for channel, ids in told_ids.items():
                    pipe.spublish(channel, ",".join(ids))
                await pipe.execute()
        return won

    async def count_deliveries(self, counted: Sequence[tuple[str, int]]
                               ) -> list[DeliveryCount]:
        if not counted:
            return []
        keys = [self._names.result(rid) for rid, _ in counted]
        with wrap_errors(ResultStoreError, "cannot count deliveries"):
            rows = await eval_per_slot(self._redis, COUNT_DELIVERIES_SCRIPT, keys, lambda idx: [
                self.ttl_s, *(counted[i][1] for i in idx)])
        return [DeliveryCount(int(n), int(solo), int(done), int(gen))
                for n, solo, done, gen in rows]

    async def mark_solo(self, request_id: str, started: bool, attempt: int = 1) -> None:
        key = self._names.result(request_id)
        with wrap_errors(ResultStoreError, "cannot record a solo run"):
            await self._redis.eval(MARK_SOLO_SCRIPT, 1, key, self.ttl_s,
                                   *([1, ""] if started else [-1, attempt]))

    async def reopen_for_replay(self, records: Sequence[tuple[str, bytes]]) -> list[int]:
        if not records:
            return []
        keys = [self._names.result(rid) for rid, _ in records]
        with wrap_errors(ResultStoreError, "cannot reopen results for replay"):
            gens = await eval_per_slot(self._redis, REOPEN_SCRIPT, keys,
                                       lambda idx: [records[i][1] for i in idx])
        return [int(g) for g in gens]

    async def get_bodies(self, request_ids: Sequence[str], terminal_only: bool = False
                         ) -> list[bytes | None]:
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            bodies = await eval_per_slot(self._redis, GET_BODIES_SCRIPT, keys,
                                         lambda idx: [int(terminal_only)])
        return [b or None for b in bodies]

    async def get_records(self, request_ids: Sequence[str], with_body: bool = False
                          ) -> list[StoredRecord | None]:
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            rows = await eval_per_slot(self._redis, GET_RECORDS_SCRIPT, keys,
                                       lambda idx: [int(with_body)])
        return [None if not row else StoredRecord(
            _str(row[0]), text_or_none(row[1]), text_or_none(row[2]),
            (row[3] or None) if with_body else None) for row in rows]

    async def cancel_views(self, request_ids: Sequence[str]) -> list[CancelView | None]:
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            rows = await eval_per_slot(self._redis, CANCEL_VIEWS_SCRIPT, keys, lambda idx: [])
        return [None if not row else CancelView(
            _str(row[0]), int(row[1] or 0), text_or_none(row[2]) or None, row[3] or None)
            for row in rows]

    async def withdraw_pending(self, request_ids: Sequence[str]) -> int:
        if not request_ids:
            return 0
        keys = [self._names.result(rid) for rid in request_ids]
        groups = list(slot_groups(keys).values())
        with wrap_errors(ResultStoreError, "cannot withdraw pending records"):
            pipe = self._redis.pipeline(transaction=False)
            for idx in groups:
                pipe.eval(WITHDRAW_SCRIPT, len(idx), *(keys[i] for i in idx))
            return sum(int(n) for n in await pipe.execute())

    async def missing(self, request_ids: Sequence[str]) -> list[str]:
        """One script per slot (a multi-key ``EXISTS`` would span slots)."""
        if not request_ids:
            return []
        keys = [self._names.result(rid) for rid in request_ids]
        with wrap_errors(ResultStoreError, "cannot read results"):
            found = await eval_per_slot(self._redis, EXISTS_EACH_SCRIPT, keys, lambda idx: [])
        return [rid for rid, there in zip(request_ids, found, strict=True) if not there]


def store_for(client: aioredis.Redis, names: Names, ttl_s: int = DEFAULT_TTL_S
              ) -> ResultStore:
    """The result store for a client: the cluster variant on a Redis Cluster."""
    if is_cluster(client):
        return ClusterResultStore(client, names.for_cluster(), ttl_s)
    return ResultStore(client, names, ttl_s)


def _str(value: bytes | str | None) -> str:
    return text_or_none(value) or ""
