"""Output and input statistics per model version, in time windows merged across workers.

Each worker summarises what it computed (``connectors.output_summary``) and flushes a
delta every few seconds: one script call per (version, side) adds the delta's fields
into the window's hash, so the fleet's window is exactly the sum of its workers. Keys
hang off the model's registry hash ``{ns}:model:{name}``, and reads go through a
per-model index, never a keyspace scan:

* ``:out:w:{label}:{side}:{start}`` — one window's fields (``output_summary.to_fields``),
  expiring ``keep_s`` after its last write; ``side`` is ``outputs`` or ``inputs``;
* ``:out:idx`` — sorted set of ``{label}|{side}|{start}``, scored by the window's end
  (windows older than ``keep_s`` are trimmed at each flush);
* ``:out:base:{label}:{side}`` — a frozen baseline (``models baseline``): the merged
  fields plus ``frozen_at`` and ``since_s``; it never expires.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis
from redis.typing import EncodableT

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.output_summary import Summary, from_fields, to_fields
from batchfleet.connectors.redis_client import queue_script
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.names import Names

SIDES: Final = ("outputs", "inputs")
#: Window length and how long windows are kept, by default (``--stats-window-s``,
#: ``--stats-keep-s``).
WINDOW_S: Final = 60
KEEP_S: Final = 24 * 3600

#: KEYS[1] the window hash. ARGV: ttl, n, n int field/value pairs, m, m float pairs.
_ADD = """
local at = 2
local n = tonumber(ARGV[at]); at = at + 1
for _ = 1, n do
  redis.call('HINCRBY', KEYS[1], ARGV[at], ARGV[at + 1]); at = at + 2
end
local m = tonumber(ARGV[at]); at = at + 1
for _ = 1, m do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[at], ARGV[at + 1]); at = at + 2
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class Flush:
    """One worker's delta for one model: ``{(label, side): summary}`` in one window."""

    start: int
    window_s: int
    keep_s: int
    deltas: Mapping[tuple[str, str], Summary]


@dataclass(frozen=True, slots=True)
class Baseline:
    """A frozen reference: one version's statistics over a past period."""

    label: str
    frozen_at: float
    since_s: float
    sides: dict[str, Summary]


def window_start(now: float, window_s: int) -> int:
    return int(now // window_s) * window_s


def merge_windows(rows: Iterable[tuple[str, str, Summary]]) -> dict[tuple[str, str], Summary]:
    """Windows of (label, side) merged into one summary each."""
    out: dict[tuple[str, str], Summary] = {}
    for label, side, summary in rows:
        out.setdefault((label, side), Summary()).merge(summary)
    return out


def _member(label: str, side: str, start: int) -> str:
    return f"{label}|{side}|{start}"


def _parse_member(member: bytes | str) -> tuple[str, str, int]:
    text = member.decode() if isinstance(member, bytes) else member
    label, side, start = text.rsplit("|", 2)
    return label, side, int(start)


class RedisOutputStats:
    """The ``OutputStats`` seam over Redis; see the module docstring for the layout."""

    def __init__(self, client: aioredis.Redis, names: Names) -> None:
        self._redis = client
        self._names = names
        self._add = client.register_script(_ADD)

    def _key(self, model: str, suffix: str) -> str:
        return f"{self._names.model(model)}:out:{suffix}"

    @wrap_errors(ResultStoreError, "cannot write the output statistics")
    async def flush(self, model: str, flush: Flush) -> None:
        """Add one worker's deltas into their window: one pipeline per model."""
        deltas = {k: s for k, s in flush.deltas.items() if not s.empty}
        if not deltas:
            return
        idx, end = self._key(model, "idx"), flush.start + flush.window_s
        pipe = self._redis.pipeline(transaction=False)
        for (label, side), summary in deltas.items():
            ints, floats = to_fields(summary)
            args: list[Any] = [flush.keep_s, len(ints)]
            for k, v in ints.items():
                args += [k, v]
            args.append(len(floats))
            for k, f in floats.items():
                args += [k, repr(f)]
            await queue_script(pipe, self._add,
                               [self._key(model, f"w:{label}:{side}:{flush.start}")], args)
            pipe.zadd(idx, {_member(label, side, flush.start): end})
        pipe.zremrangebyscore(idx, "-inf", end - flush.keep_s - flush.window_s)
        pipe.expire(idx, flush.keep_s + flush.window_s)
        await pipe.execute()

    @wrap_errors(ResultStoreError, "cannot read the output statistics")
    async def read(self, model: str, since: float, until: float | None = None,
                   labels: Collection[str] | None = None, side: str | None = None
                   ) -> dict[tuple[str, str], Summary]:
        """Every (label, side) merged over the windows that end after ``since`` (and at or
        before ``until``), only ``labels`` and ``side`` when given: two round trips
        whatever the number of windows."""
        members = await self._redis.zrangebyscore(
            self._key(model, "idx"), f"({since}", "+inf" if until is None else until)
        found = [f for f in (_parse_member(m) for m in members if isinstance(m, bytes | str))
                 if (labels is None or f[0] in labels) and (side is None or f[1] == side)]
        if not found:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for label, s, start in found:
            pipe.hgetall(self._key(model, f"w:{label}:{s}:{start}"))
        rows = await pipe.execute()
        return merge_windows((label, s, from_fields(row))
                             for (label, s, _), row in zip(found, rows, strict=True) if row)

    @wrap_errors(ResultStoreError, "cannot write the baseline")
    async def freeze(self, model: str, baseline: Baseline) -> None:
        """Store a version's baseline (replacing any earlier one) in one transaction."""
        pipe = self._redis.pipeline(transaction=True)
        for side in SIDES:
            key = self._key(model, f"base:{baseline.label}:{side}")
            pipe.delete(key)
            ints, floats = to_fields(baseline.sides.get(side, Summary()))
            fields: dict[EncodableT, EncodableT] = {**{k: str(v) for k, v in ints.items()},
                      **{k: repr(v) for k, v in floats.items()},
                      "frozen_at": repr(baseline.frozen_at), "since_s": repr(baseline.since_s)}
            pipe.hset(key, mapping=fields)
        await pipe.execute()

    @wrap_errors(ResultStoreError, "cannot read the baselines")
    async def baselines(self, model: str, labels: Iterable[str]) -> dict[str, Baseline]:
        """The baselines of those labels that have one (one round trip)."""
        ordered = sorted(set(labels))
        if not ordered:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for label in ordered:
            for side in SIDES:
                pipe.hgetall(self._key(model, f"base:{label}:{side}"))
        rows = await pipe.execute()
        out: dict[str, Baseline] = {}
        for i, label in enumerate(ordered):
            got = rows[2 * i: 2 * i + 2]
            if got[0]:
                out[label] = decode_baseline(label, dict(zip(SIDES, got, strict=True)))
        return out


def decode_baseline(label: str, sides: Mapping[str, Mapping[Any, Any]]) -> Baseline:
    head = {(k.decode() if isinstance(k, bytes) else k): v
            for k, v in sides["outputs"].items()}
    return Baseline(label, float(head.get("frozen_at", 0.0)), float(head.get("since_s", 0.0)),
                    {side: from_fields(raw) for side, raw in sides.items()})
