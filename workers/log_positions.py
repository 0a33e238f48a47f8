"""First deliveries on a log that keeps no delivery count (Kafka), told apart by claims.

Redis Streams counts deliveries: a new entry is handed out once, a reclaimed one twice
or more, and the quarantine counts only redeliveries. Kafka counts nothing, so every
Kafka delivery used to be counted in its result record, a Lua update a request on the
hot path. Instead, each fetch raises its log's claim before anything in it runs (one
call a fetch, durable in the result store): the highest offset handed out, and the
newest record timestamp among those records.

A record above the claim found there was never handed out: a first delivery (1). One at
or below it was, unless the log went back since (a broker restarted empty, a topic
recreated: new records reuse the old offsets). Such new records are newer than anything
the claim covers, so a record counts as a redelivery (2) only where its timestamp is not
newer than the claim's; otherwise its count stays unknown (None) and the quarantine
counts it as it counts any unknown delivery. A worker's death is seen at its records'
first redelivery, as on Redis.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from batchfleet.connectors.broker import Delivery
from batchfleet.connectors.values import LogClaim, LogPosition

Claims = Sequence[tuple[str, int, int]]
Claim = Callable[[Claims], Awaitable[list[LogClaim]]]


#: How far past this worker's clock a record's timestamp may raise a claim (ms). A producer
#: stamps its records (CreateTime); one whose clock is far ahead would otherwise date the
#: claim into the future, and a log that went back later would pass for redeliveries.
CLOCK_SKEW_MS = 60_000


def claims_for(positions: Sequence[LogPosition], now_ms: int) -> list[tuple[str, int, int]]:
    """Per log, the highest offset and the newest timestamp among ``positions``, the
    timestamp held to ``now_ms`` + ``CLOCK_SKEW_MS``."""
    latest = now_ms + CLOCK_SKEW_MS
    highest: dict[str, tuple[int, int]] = {}
    for log, offset, stamp in positions:
        hi, ts = highest.get(log, (-1, -1))
        highest[log] = (max(hi, offset), max(ts, min(stamp, latest)))
    return [(log, hi, ts) for log, (hi, ts) in highest.items()]


def delivery_count(position: LogPosition, before: LogClaim) -> int | None:
    """1 for a first delivery, 2 for a redelivery, None where the claim cannot tell."""
    if position.offset > before.offset:
        return 1
    if 0 <= position.timestamp_ms <= before.timestamp_ms:
        return 2
    return None


async def tell_first_deliveries(deliveries: Sequence[Delivery], claim: Claim) -> None:
    """Set ``delivery_count`` on each delivery that has a position and no count, after
    raising the claims of their logs (``claim``: the caller retries it until it lands)."""
    placed = [(d, p) for d in deliveries
              if d.delivery_count is None and (p := d.position) is not None]
    if not placed:
        return
    claims = claims_for([p for _, p in placed], int(time.time() * 1000))
    before = dict(zip((log for log, _, _ in claims), await claim(claims), strict=True))
    for delivery, position in placed:
        delivery.delivery_count = delivery_count(position, before[position.log])
