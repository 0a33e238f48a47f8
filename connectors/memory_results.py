"""``memory://`` results, delivery ledger, lane losses and announcements.

The same rules as the Redis scripts in ``connectors.result_store``, step for step, each
under the state's lock (what a script's atomicity gives): the first terminal write wins
and only at or above the record's generation; a replay raises the generation; a won write
frees the owner's in-flight slot and announces the result to its client in the format
the request asked for (docs/wire-format.md §8).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import msgpack

from batchfleet.connectors.announcements import parse_announcement
from batchfleet.connectors.memory_state import MemoryState, Subscriber
from batchfleet.connectors.values import (
    Announced,
    CancelView,
    DeliveryCount,
    LogClaim,
    Ownership,
    StoredRecord,
    StorePressure,
    SubmitState,
    TerminalWrite,
    reopenable,
)
from batchfleet.schemas.envelopes import NOTIFY_RESULTS


class MemoryResults:
    """``StoreResults`` in process memory."""

    def __init__(self, state: MemoryState, ttl_s: int) -> None:
        self._state = state
        self.ttl_s = ttl_s
        self.closed = False

    async def put_pending(self, records: Sequence[tuple[str, bytes]],
                          owners: Sequence[Ownership] | None = None) -> list[SubmitState]:
        out: list[SubmitState] = []
        s = self._state
        with s.lock:
            for i, (rid, body) in enumerate(records):
                o = owners[i] if owners is not None else Ownership()
                rec = s.record(rid)
                if rec is None or "status" not in rec:
                    rec = s.touch(rid)
                    rec.update(status="pending", gen=0, body=body)
                    for name, value in (("owner", o.owner), ("notify", o.notify),
                                        ("fp", o.fingerprint)):
                        if value:
                            rec[name] = value
                    s.expire(rid, self.ttl_s)
                    out.append(SubmitState.NEW)
                elif o.fingerprint and rec.get("fp", o.fingerprint) != o.fingerprint:
                    out.append(SubmitState.CONFLICT)
                elif rec["status"] == "pending":
                    out.append(SubmitState.PENDING)
                else:
                    out.append(SubmitState.TERMINAL)
        return out

    async def write_terminal(self, writes: Sequence[TerminalWrite]) -> list[bool]:
        won: list[bool] = []
        pairs: dict[str, list[object]] = {}
        ids: dict[str, list[str]] = {}
        s = self._state
        with s.lock:
            for w in writes:
                rec = s.record(w.request_id)
                status = rec.get("status") if rec else None
                if status not in (None, "pending") or w.generation < int(
                        (rec or {}).get("gen", 0)):
                    won.append(False)
                    continue
                rec = s.touch(w.request_id)
                rec.update(status=w.status, gen=w.generation, body=w.body)
                s.expire(w.request_id, self.ttl_s)
                owner = rec.get("owner")
                if owner:
                    s.inflight.get(owner, {}).pop(w.request_id, None)
                won.append(True)
                if not w.notify_channel:
                    continue
                if w.notify_format == NOTIFY_RESULTS:
                    pairs.setdefault(w.notify_channel, []).extend((w.request_id, w.body))
                else:
                    ids.setdefault(w.notify_channel, []).append(w.request_id)
            for client, flat in pairs.items():
                s.publish(client, msgpack.packb(flat, use_bin_type=True))
            for client, joined in ids.items():
                s.publish(client, ",".join(joined).encode())
        return won

    async def count_deliveries(self, counted: Sequence[tuple[str, int]]
                               ) -> list[DeliveryCount]:
        out: list[DeliveryCount] = []
        s = self._state
        with s.lock:
            for rid, before in counted:
                rec = s.record(rid)
                n = int((rec or {}).get("deliveries", 0))
                if before >= 0:
                    n = max(n, before) + 1
                    rec = s.touch(rid)
                    rec["deliveries"] = n
                    s.expire_if_none(rid, self.ttl_s)
                rec = rec or {}
                gen = int(rec.get("gen", 0))
                status = rec.get("status")
                done = gen if status and status != "pending" else -1
                out.append(DeliveryCount(n, int(rec.get("solo", 0)), done, gen))
        return out

    async def mark_solo(self, request_id: str, started: bool, attempt: int = 1) -> None:
        s = self._state
        with s.lock:
            rec = s.touch(request_id)
            rec["solo"] = int(rec.get("solo", 0)) + (1 if started else -1)
            if not started:
                rec["deliveries"] = attempt

    async def note_stalls(self, request_ids: Sequence[str]) -> list[int]:
        out: list[int] = []
        with self._state.lock:
            for rid in request_ids:
                rec = self._state.touch(rid)
                rec["stalls"] = int(rec.get("stalls", 0)) + 1
                out.append(rec["stalls"])
        return out

    async def reopen_for_replay(self, records: Sequence[tuple[str, bytes]]) -> list[int]:
        out: list[int] = []
        with self._state.lock:
            for rid, body in records:
                rec = self._state.record(rid)
                if rec is None or not reopenable(rec.get("status"), rec.get("body")):
                    out.append(-1)
                    continue
                gen = int(rec.get("gen", 0)) + 1
                rec.update(status="pending", gen=gen, deliveries=0, solo=0, stalls=0, body=body)
                out.append(gen)
        return out

    async def get_bodies(self, request_ids: Sequence[str], terminal_only: bool = False
                         ) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._state.lock:
            for rid in request_ids:
                rec = self._state.record(rid) or {}
                status = rec.get("status")
                if terminal_only and status in (None, "pending"):
                    out.append(None)
                else:
                    out.append(rec.get("body") or None)
        return out

    async def get_records(self, request_ids: Sequence[str], with_body: bool = False
                          ) -> list[StoredRecord | None]:
        out: list[StoredRecord | None] = []
        with self._state.lock:
            for rid in request_ids:
                rec = self._state.record(rid)
                if not rec or "status" not in rec:
                    out.append(None)
                    continue
                out.append(StoredRecord(rec["status"], rec.get("owner"), rec.get("fp"),
                                        (rec.get("body") or None) if with_body else None))
        return out

    async def cancel_views(self, request_ids: Sequence[str]) -> list[CancelView | None]:
        out: list[CancelView | None] = []
        with self._state.lock:
            for rid in request_ids:
                rec = self._state.record(rid)
                if not rec or "status" not in rec:
                    out.append(None)
                    continue
                out.append(CancelView(rec["status"], int(rec.get("gen", 0)),
                                      rec.get("notify") or None, rec.get("body") or None))
        return out

    async def withdraw_pending(self, request_ids: Sequence[str]) -> int:
        n = 0
        with self._state.lock:
            for rid in request_ids:
                rec = self._state.record(rid)
                if rec and rec.get("status") == "pending" and not int(rec.get("gen", 0)) \
                        and not int(rec.get("deliveries", 0)):
                    self._state.delete(rid)
                    n += 1
        return n

    async def mark_lane_losses(self, losses: Mapping[str, int]) -> None:
        with self._state.lock:
            for lane, ms in losses.items():
                if int(ms) > self._state.lane_losses.get(lane, 0):
                    self._state.lane_losses[lane] = int(ms)

    async def claim_positions(self, claims: Sequence[tuple[str, int, int]]
                              ) -> list[LogClaim]:
        out: list[LogClaim] = []
        with self._state.lock:
            for log, offset, timestamp_ms in claims:
                prev_hi, prev_ts = self._state.log_claims.get(log, (-1, -1))
                if offset > prev_hi:
                    self._state.log_claims[log] = (offset, max(prev_ts, timestamp_ms))
                out.append(LogClaim(prev_hi, prev_ts))
        return out

    async def lane_losses(self) -> dict[str, int]:
        with self._state.lock:
            return dict(self._state.lane_losses)

    async def missing(self, request_ids: Sequence[str]) -> list[str]:
        with self._state.lock:
            return [rid for rid in request_ids if self._state.record(rid) is None]

    async def pressure(self) -> StorePressure:
        """Process memory has no ``maxmemory`` and never evicts: no pressure, safe policy."""
        return StorePressure(0, 0, "noeviction")

    async def ping(self) -> bool:
        return not self.closed

    async def close(self) -> None:
        self.closed = True


class MemorySubscription:
    def __init__(self, state: MemoryState, client_id: str, sub: Subscriber) -> None:
        self._state = state
        self._client_id = client_id
        self._sub = sub

    async def next(self, timeout_s: float) -> list[Announced]:
        """The next announcement's (request ID, body or None) pairs, [] after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            seen = self._sub.wakeup.version
            with self._state.lock:
                message = self._sub.messages.popleft() if self._sub.messages else None
            if message is not None:
                return parse_announcement(message)
            left = deadline - loop.time()
            if left <= 0 or self._sub.closed:
                return []
            await self._sub.wakeup.wait(seen, left)

    async def close(self) -> None:
        with self._state.lock:
            self._sub.closed = True
            subs = self._state.subscribers.get(self._client_id, [])
            if self._sub in subs:
                subs.remove(self._sub)
        self._sub.wakeup.notify()


class MemoryAnnouncements:
    def __init__(self, state: MemoryState) -> None:
        self._state = state

    async def subscribe(self, client_id: str) -> MemorySubscription:
        sub = Subscriber()
        with self._state.lock:
            self._state.subscribers.setdefault(client_id, []).append(sub)
        return MemorySubscription(self._state, client_id, sub)
