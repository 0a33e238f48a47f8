"""The heartbeat record: what a live worker says about itself, and its one codec.

Workers write it, ``batchfleet status`` and the process launcher read it. It is
msgpack of a map, so a reader from another version keeps the fields it knows:
``v`` is the layout version (absent means 1, the layout before it was written),
and a reader refuses only a map without ``worker_id`` or from a newer major ``v``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

VERSION = 1
#: How often a live worker beats (``workers.heartbeat``).
BEAT_EVERY_S = 2.0
#: A worker whose last beat is older than this has missed two beats: killed, hung or cut
#: off. Readers that must not count a dead worker as live (``rollout status``) use this,
#: not the record's TTL, which keeps a SIGKILLed worker visible for up to 10 s.
LIVE_WITHIN_S = 5
#: The worker's counters (``WorkerStats``) carried in a heartbeat.
COUNTERS = ("batches", "computed", "succeeded", "failed", "expired", "duplicates", "retried",
            "dead_lettered", "quarantined", "undecodable",
            # result cache (docs/cache.md); saved compute in whole milliseconds
            "cache_hits", "cache_coalesced", "cache_misses", "cache_errors", "cache_saved_ms")


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    worker_id: str
    host: str = ""
    started_at: float | None = None
    seen_at: float | None = None
    models: tuple[str, ...] = ()
    device: str = ""
    broker: str = ""
    breakers: dict[str, str] = field(default_factory=dict)
    buffered: int = 0
    throughput_rps: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    #: Per "model/lane": backlog, oldest_age_s, time_to_drain_s, p99_ms, as the worker saw them.
    lanes: dict[str, dict[str, float | None]] = field(default_factory=dict)
    #: Per model: the rollout policy epoch this worker routes by, and when it applied it.
    policy_epochs: dict[str, int] = field(default_factory=dict)
    policy_applied_at: dict[str, float] = field(default_factory=dict)
    #: Per model: its own req/s (``rps``) and counters since start (``batches``, ``rows``,
    #: terminal writes by status; ``degraded`` once workers report it). Absent from older
    #: workers, whose whole rate then stands for each model they serve.
    model_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Every other field the worker sent (vitals this reader does not model).
    extra: dict[str, Any] = field(default_factory=dict)


def encode_heartbeat(info: Mapping[str, Any]) -> bytes:
    """A worker's vitals map, stamped with the layout version."""
    return msgpack.packb({"v": VERSION, **info})  # type: ignore[no-any-return]


def decode_heartbeat(raw: bytes) -> HeartbeatRecord | None:
    """The record, or None when the bytes are not a heartbeat this version understands."""
    try:
        info = msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(info, dict) or "worker_id" not in info:
        return None
    if int(info.get("v") or 1) > VERSION:
        return None
    nested = info.get("counters")
    source = nested if isinstance(nested, dict) else info
    known = {"v", "worker_id", "host", "started_at", "seen_at", "models", "device", "broker",
             "breakers", "buffered", "throughput_rps", "counters", "lanes", "policy_epochs",
             "policy_applied_at", "model_stats", *COUNTERS}
    seen, started = info.get("seen_at"), info.get("started_at")
    return HeartbeatRecord(
        worker_id=str(info["worker_id"]), host=str(info.get("host", "")),
        started_at=float(started) if started else None,
        seen_at=float(seen) if seen else None,
        models=tuple(str(m) for m in info.get("models") or ()),
        device=str(info.get("device", "")), broker=str(info.get("broker", "")),
        breakers={str(k): str(v) for k, v in (info.get("breakers") or {}).items()},
        buffered=int(info.get("buffered") or 0),
        throughput_rps=float(info.get("throughput_rps") or 0.0),
        counters={k: int(source.get(k) or 0) for k in COUNTERS},
        lanes={str(k): dict(v) for k, v in (info.get("lanes") or {}).items()
               if isinstance(v, dict)},
        policy_epochs={str(k): int(v) for k, v in (info.get("policy_epochs") or {}).items()},
        policy_applied_at={str(k): float(v)
                           for k, v in (info.get("policy_applied_at") or {}).items()},
        model_stats=_model_stats(info.get("model_stats")),
        extra={k: v for k, v in info.items() if k not in known})


def _model_stats(raw: Any) -> dict[str, dict[str, float]]:
    """Per-model figures, numbers only (a field this reader cannot read is left out)."""
    if not isinstance(raw, dict):
        return {}
    return {str(model): {str(k): float(v) for k, v in figures.items()
                         if isinstance(v, int | float) and not isinstance(v, bool)}
            for model, figures in raw.items() if isinstance(figures, dict)}
