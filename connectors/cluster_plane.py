"""Control-plane seams whose single-node scripts span a result record and a
control-plane key: on Redis Cluster each is a check per slot group, then the write.

Dead letters: the record check and the stream append are two steps.

On one node, ``dead_letters._ADD`` checks the result record, appends to the model's
dead-letter stream and marks the record in one script. On a cluster the record
(its own hash tag) and the stream (the control-plane tag) sit in different slots,
so the cluster variant checks the records (one script call per slot group), appends
the eligible letters, and only then marks their records ``dlq = gen``. A worker that
dies between the append and the mark, or two workers dead-lettering the same copy at
once, can leave a second letter for one (request ID, generation): at least once on a
cluster, where a single node gives exactly once. The request itself still reaches one
terminal result (the first terminal write wins).

Retries: ``add_live`` checks that each request is still live (per slot group), then
schedules the live ones. A request that finishes in between is retried once more
than needed; its write is refused (first terminal wins), so only compute is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from batchfleet.connectors.cluster_store import eval_per_slot
from batchfleet.connectors.dead_letters import DeadLetterQueue
from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.retry_schedule import RetrySchedule
from batchfleet.connectors.values import DeadLetter, Lettered, Retry
from batchfleet.schemas.errors import ResultStoreError

#: Per key: -1 superseded by a replay, 0 already lettered or terminal, 1 eligible.
_CHECK = """
local out = {}
for i, key in ipairs(KEYS) do
  local gen = tonumber(ARGV[i])
  local cur = redis.call('HMGET', key, 'status', 'gen', 'dlq')
  if gen < (tonumber(cur[2]) or 0) then out[i] = -1
  elseif (tonumber(cur[3]) or -1) >= gen or (cur[1] and cur[1] ~= 'pending') then out[i] = 0
  else out[i] = 1 end
end
return out
"""

#: Mark records lettered at a generation (never lowering it); ARGV[1] is the TTL.
_MARK = """
local out = {}
for i, key in ipairs(KEYS) do
  if (tonumber(redis.call('HGET', key, 'dlq')) or -1) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', key, 'dlq', ARGV[i + 1])
  end
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, tonumber(ARGV[1])) end
  out[i] = 1
end
return out
"""


class ClusterDeadLetterQueue(DeadLetterQueue):
    async def add(self, letters: Sequence[DeadLetter]) -> list[Lettered]:
        if not letters:
            return []
        keys = [self._names.result(dl.request_id) for dl in letters]
        with wrap_errors(ResultStoreError, "cannot write the dead-letter queue"):
            found = await eval_per_slot(self._redis, _CHECK, keys, lambda idx: [
                letters[i].generation for i in idx])
            # one letter per (request ID, generation) within the batch, like the script
            seen: set[tuple[str, int]] = set()
            states: list[Lettered] = []
            for dl, state in zip(letters, found, strict=True):
                first = (dl.request_id, dl.generation) not in seen
                seen.add((dl.request_id, dl.generation))
                states.append(Lettered(int(state)) if first or int(state) < 0
                              else Lettered.KNOWN)
            added = [i for i, s in enumerate(states) if s is Lettered.ADDED]
            if added:
                pipe = self._redis.pipeline(transaction=False)
                for i in added:
                    dl = letters[i]
                    fields: dict[Any, Any] = {
                        "id": dl.request_id, "model": dl.model, "envelope": dl.envelope,
                        "attempts": dl.attempts, "errors": msgpack.packb(dl.errors),
                        "reason": dl.reason, "at": repr(dl.dead_at), "gen": dl.generation}
                    pipe.xadd(self._names.dead_letter_stream(dl.model), fields)
                pipe.sadd(self._models_key, *{letters[i].model for i in added})
                await pipe.execute()
                await eval_per_slot(self._redis, _MARK, [keys[i] for i in added],
                                    lambda idx: [self._ttl_s,
                                                 *(letters[added[j]].generation for j in idx)])
        return states


#: Per key: 1 while the request is live at ARGV[i] (record missing or pending, not at a
#: newer generation), else 0 (the checks of ``retry_schedule._ADD_LIVE``).
_LIVE = """
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('HMGET', key, 'status', 'gen')
  if (cur[1] and cur[1] ~= 'pending') or tonumber(ARGV[i]) < (tonumber(cur[2]) or 0) then
    out[i] = 0
  else out[i] = 1 end
end
return out
"""


class ClusterRetrySchedule(RetrySchedule):
    async def add_live(self, retries: Sequence[Retry]) -> list[bool]:
        if not retries:
            return []
        keys = [self._names.result(r.request_id) for r in retries]
        with wrap_errors(ResultStoreError, "cannot schedule retries"):
            live = [bool(x) for x in await eval_per_slot(
                self._redis, _LIVE, keys, lambda idx: [retries[i].generation for i in idx])]
            due = {r.envelope: r.due for r, ok in zip(retries, live, strict=True) if ok}
            if due:
                await self._redis.zadd(self._key, due)
        return live
