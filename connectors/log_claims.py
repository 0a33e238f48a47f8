"""Claims on ordered logs, in the result store's Redis: how far each Kafka partition has
been handed out, raised before the records run (``workers.log_positions`` reads them).

One hash under the control plane's name (one slot on Redis Cluster), two fields a log:
a fetch of a few partitions is one call, and nothing here grows with the requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchfleet.connectors.values import LogClaim

#: KEYS[1] the claims hash; ARGV[1] its TTL, then per log: name, highest offset handed
#: out now, newest timestamp among those records. Replies, per log, what was on record
#: before ({-1, -1} for none). The offset only rises; the timestamp rises with it, and
#: only with it: a log that went back (a broker restarted empty) must not date its new
#: records into the old log's range. Values pass as the strings they came in as (a Lua
#: number would be written with 14 significant digits).
CLAIM_SCRIPT = """
local out = {}
for i = 2, #ARGV, 3 do
  local log, hi, ts = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local cur = redis.call('HMGET', KEYS[1], log .. '|hi', log .. '|ts')
  local prev_hi, prev_ts = tonumber(cur[1]) or -1, tonumber(cur[2]) or -1
  if hi > prev_hi then
    local newest = ARGV[i + 2]
    if prev_ts > ts then newest = cur[2] end
    redis.call('HSET', KEYS[1], log .. '|hi', ARGV[i + 1], log .. '|ts', newest)
  end
  out[#out + 1] = {prev_hi, prev_ts}
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return out
"""


def claim_args(ttl_s: int, claims: Sequence[tuple[str, int, int]]) -> list[str | int]:
    """``CLAIM_SCRIPT``'s ARGV for ``claims`` of ``(log, offset, timestamp_ms)``."""
    args: list[str | int] = [ttl_s]
    for log, offset, timestamp_ms in claims:
        args += [log, int(offset), int(timestamp_ms)]
    return args


def claims_from(rows: Sequence[Sequence[int]]) -> list[LogClaim]:
    return [LogClaim(int(hi), int(ts)) for hi, ts in rows]
