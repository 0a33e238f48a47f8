"""The fleet reader behind ``batchfleet status`` (and any gateway view): one snapshot.

Where each number comes from:

* **workers**: the heartbeat records found through the heartbeat set
  (``connectors.heartbeats``): every live worker refreshes its record every 2 s
  with a 10 s TTL, so a dead worker drops out on its own;
* **models**: the registry set ``{prefix}:models``, plus whatever live workers
  serve and whatever has a dead-letter queue (the set ``{prefix}:dlq:_models``);
* **depth** of a lane: on Redis the length of its stream (workers ``XDEL`` what
  they finish, so the length is the backlog, in-flight entries included), its
  **oldest age** from the first entry's ID, and the group's **lag** (entries not
  yet delivered) and **pending** entries from ``XINFO GROUPS``. A sharded lane
  (``--lane-shards``) adds up its shard streams (depth, lag, pending; the oldest age is
  the oldest shard's), for every shard the registry says may hold work
  (``max(lane_shards, lane_shards_max)``). On Kafka it is
  the sum of the lag each live worker reports for its own partitions, so it is
  unknown while no worker serves the lane (KEDA reads the group's lag itself);
* **DLQ** sizes: ``XLEN`` of ``{prefix}:dlq:{model}``;
* **throughput, batch size, error and degraded rates, p99, breakers**: the
  heartbeats. Each worker reports every model's own rate and counters
  (``connectors.fleet_models``), and the fleet's p99 of a lane is the worst p99
  any worker reports (percentiles do not add up).

:func:`summarize` is pure (heartbeats and Redis replies in, a snapshot out);
:class:`FleetReader` does the I/O in a fixed number of pipelined round trips and
never scans the keyspace. The CLI (``batchfleet.status``) only renders.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from batchfleet.connectors.errors import wrap_errors
from batchfleet.connectors.fleet_models import model_figures
from batchfleet.connectors.heartbeats import RedisHeartbeats
from batchfleet.connectors.model_registry import RedisModelRegistry
from batchfleet.connectors.redis_client import is_cluster_url, names_for
from batchfleet.connectors.urls import BrokerURL
from batchfleet.schemas.errors import ResultStoreError
from batchfleet.schemas.heartbeat import COUNTERS, HeartbeatRecord, decode_heartbeat
from batchfleet.schemas.names import LANES, Names

#: A heartbeat older than this is a dead worker's (workers beat every 2 s).
HEARTBEAT_TTL_S = 10


@dataclass(frozen=True, slots=True)
class StreamStats:
    """One lane's queue: from its stream on Redis, from the heartbeats on Kafka."""

    depth: int | None
    oldest_age_s: float | None
    lag: int | None
    pending: int | None
    #: Shard streams added up (``--lane-shards``); 1 for an unsharded lane.
    shards: int = 1


def combine_shards(parts: Sequence[StreamStats]) -> StreamStats:
    """One lane's stats from its shard streams': counts add up, the oldest age is the
    oldest shard's; a count no shard knows stays unknown."""
    def total(values: Iterable[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None
    if len(parts) == 1:
        return parts[0]
    return StreamStats(total(p.depth for p in parts), _worst(p.oldest_age_s for p in parts),
                       total(p.lag for p in parts), total(p.pending for p in parts),
                       len(parts))


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    host: str
    models: tuple[str, ...]
    device: str
    broker: str
    breakers: dict[str, str]
    buffered: int
    throughput_rps: float
    seen_s_ago: float | None
    up_s: float | None
    counters: dict[str, int]
    #: Per "model/lane": backlog, oldest_age_s, time_to_drain_s, p99_ms, as the worker saw them.
    lanes: dict[str, dict[str, float | None]] = field(repr=False)
    #: Model -> seconds a compute thread of it has been stuck past its limit (none: {}).
    stuck_compute: dict[str, float] = field(default_factory=dict)
    #: Model -> its own req/s and counters since start (``HeartbeatRecord.model_stats``).
    model_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Answers its fallback chains gave per second, lately (docs/degradation.md).
    degraded_rps: float = 0.0
    #: Models held in memory, where it loads them on demand (``--max-loaded-models``);
    #: None: it holds every model it serves.
    loaded: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class LaneView:
    model: str
    lane: str
    #: Requests on the lane not finished yet (Redis: stream length; Kafka: summed lag).
    depth: int | None
    #: Not yet delivered to any worker (Redis: the group's lag; Kafka: same as depth).
    lag: int | None
    #: Delivered to a worker and not acked yet (Redis only).
    pending: int | None
    oldest_age_s: float | None
    p99_ms: float | None
    #: Depth over the rate of the workers still pulling; None when nothing drains the lane.
    time_to_drain_s: float | None
    #: Model-wide, repeated on each of its lanes so one row is enough for scripts.
    throughput_rps: float
    workers: int
    dlq: int
    breakers: dict[str, dict[str, int]]
    #: Shard streams the lane's numbers add up (Redis ``--lane-shards``); 1 otherwise.
    shards: int = 1
    #: Model-wide, like ``throughput_rps`` (``connectors.fleet_models``): rows per batch,
    #: failed and degraded shares of terminal writes, over the live workers' counters.
    mean_batch_size: float | None = None
    error_rate: float | None = None
    degraded_rate: float | None = None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    taken_at: float
    namespace: str
    broker: str
    lanes: tuple[LaneView, ...]
    workers: tuple[WorkerView, ...]
    undecodable: int
    retry_scheduled: int
    #: The broker is a Redis Cluster (``broker`` stays ``redis``: the kind scripts match).
    cluster: bool = False

    @property
    def broker_title(self) -> str:
        """How a title names the broker: ``redis cluster`` for ``redis+cluster://``."""
        return "redis cluster" if self.cluster else self.broker

    @property
    def throughput_rps(self) -> float:
        return sum(w.throughput_rps for w in self.workers)

    def to_json(self) -> dict[str, Any]:
        workers = [{k: v for k, v in asdict(w).items() if k != "lanes"} for w in self.workers]
        return {
            "taken_at": self.taken_at, "namespace": self.namespace, "broker": self.broker,
            "lanes": [asdict(lane) for lane in self.lanes], "workers": workers,
            "totals": {
                "workers": len(self.workers), "throughput_rps": round(self.throughput_rps, 2),
                "depth": sum(lane.depth or 0 for lane in self.lanes),
                "dlq": sum({lane.model: lane.dlq for lane in self.lanes}.values()),
                "undecodable": self.undecodable, "retry_scheduled": self.retry_scheduled,
            },
        }


# --- pure part -------------------------------------------------------------------


def worker_view(record: HeartbeatRecord, now: float) -> WorkerView:
    """A decoded heartbeat as the fleet reader shows it (ages against ``now``)."""
    return WorkerView(
        worker_id=record.worker_id, host=record.host, models=record.models,
        device=record.device, broker=record.broker, breakers=dict(record.breakers),
        buffered=record.buffered, throughput_rps=record.throughput_rps,
        seen_s_ago=max(0.0, now - record.seen_at) if record.seen_at else None,
        up_s=max(0.0, now - record.started_at) if record.started_at else None,
        counters={k: int(record.counters.get(k) or 0) for k in COUNTERS},
        lanes=dict(record.lanes),
        stuck_compute={str(k): float(v)
                       for k, v in (record.extra.get("stuck_compute") or {}).items()},
        model_stats={m: dict(v) for m, v in record.model_stats.items()},
        degraded_rps=float(record.extra.get("degraded_rps") or 0.0),
        loaded=(None if record.extra.get("loaded") is None
                else tuple(str(m) for m in record.extra["loaded"])))


def parse_heartbeat(raw: bytes, now: float) -> WorkerView | None:
    """A heartbeat's bytes, or None when they are not one this version understands."""
    record = decode_heartbeat(raw)
    return None if record is None else worker_view(record, now)


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _breaker_counts(workers: Iterable[WorkerView]) -> dict[str, dict[str, int]]:
    """Per breaker, how many of these workers have it in each state."""
    counts: dict[str, Counter[str]] = {}
    for w in workers:
        for name, state in w.breakers.items():
            counts.setdefault(name, Counter())[state] += 1
    return {name: dict(states) for name, states in counts.items()}


def summarize(broker: str, namespace: str, models: Iterable[str], workers: Sequence[WorkerView],
              streams: Mapping[tuple[str, str], StreamStats], dlq: Mapping[str, int],
              undecodable: int = 0, retry_scheduled: int = 0,
              now: float | None = None) -> FleetSnapshot:
    """Join heartbeats and Redis replies into one row per (model, lane). No I/O."""
    every = sorted({*models, *dlq, *(m for w in workers for m in w.models)})
    lanes = []
    for model in every:
        serving = [w for w in workers if model in w.models]
        figures = model_figures(model, ((w.model_stats, w.throughput_rps) for w in serving))
        # a worker with a breaker open pulls nothing, whatever its recent rate says
        pulling = model_figures(model, ((w.model_stats, w.throughput_rps) for w in serving
                                        if "open" not in w.breakers.values())).throughput_rps
        breakers = _breaker_counts(serving)
        for lane in LANES:
            seen = [w.lanes[f"{model}/{lane}"] for w in serving if f"{model}/{lane}" in w.lanes]
            if broker == "redis":
                stats = streams.get((model, lane), StreamStats(0, None, 0, 0))
            else:  # Kafka: each worker reports the lag of the partitions it owns
                backlog = int(sum(s.get("backlog") or 0 for s in seen)) if seen else None
                stats = StreamStats(backlog, _worst(s.get("oldest_age_s") for s in seen),
                                    backlog, None)
            depth, lag, pending, oldest = stats.depth, stats.lag, stats.pending, stats.oldest_age_s
            drain = 0.0 if depth == 0 else depth / pulling if depth and pulling > 0 else None
            lanes.append(LaneView(
                model=model, lane=lane, depth=depth, lag=lag, pending=pending,
                oldest_age_s=oldest, p99_ms=_worst(s.get("p99_ms") for s in seen),
                time_to_drain_s=drain, throughput_rps=figures.throughput_rps,
                workers=len(serving), dlq=int(dlq.get(model, 0)), breakers=breakers,
                shards=stats.shards, mean_batch_size=figures.mean_batch_size,
                error_rate=figures.error_rate, degraded_rate=figures.degraded_rate))
    return FleetSnapshot(
        taken_at=time.time() if now is None else now, namespace=namespace, broker=broker,
        lanes=tuple(lanes), workers=tuple(sorted(workers, key=lambda w: w.worker_id)),
        undecodable=undecodable, retry_scheduled=retry_scheduled)


# --- I/O ---------------------------------------------------------------------------


def _stream_stats(depth: Any, first: Any, groups: Any, group: bytes, now_ms: float
                  ) -> StreamStats:
    age = None
    if first and not isinstance(first, Exception):
        age = max(0.0, (now_ms - int(first[0][0].split(b"-")[0])) / 1000.0)
    lag = pending = None
    if isinstance(groups, list):  # an error here means no stream or no group yet
        for info in groups:
            if info.get("name") == group:
                lag, pending = info.get("lag"), info.get("pending")
    return StreamStats(int(depth or 0), age if depth else None,
                       None if lag is None else int(lag),
                       None if pending is None else int(pending))


class FleetReader:
    """Reads snapshots; keeps its connections open between them (for ``--watch``).

    Never scans the keyspace: workers come from the heartbeat set
    (``connectors.heartbeats``), models from the registry set and the DLQ model set,
    so a snapshot costs the same few round trips at ten result keys or a million:
    two for the heartbeats, one for the sets, one for the DLQ sizes and one for the
    lanes (each pipelined)."""

    def __init__(self, broker: BrokerURL, results_url: str, names: Names) -> None:
        from batchfleet.connectors.redis_client import redis_client

        self._broker = broker
        self._names = names = names_for(results_url, names)
        self._store = redis_client(results_url)
        self._heartbeats = RedisHeartbeats(self._store, names)
        same = broker.kind == "redis" and broker.url == results_url
        self._streams = (self._store if same else redis_client(broker.url)) \
            if broker.kind == "redis" else None

    async def close(self) -> None:
        await self._store.aclose()
        if self._streams is not None and self._streams is not self._store:
            await self._streams.aclose()

    @wrap_errors(ResultStoreError, "cannot read the fleet")
    async def read(self) -> FleetSnapshot:
        names, store = self._names, self._store
        now = time.time()
        workers = [worker_view(r, now) for r in await self._heartbeats.read_all(HEARTBEAT_TTL_S)]
        pipe = store.pipeline(transaction=False)
        pipe.smembers(names.model_registry)
        pipe.smembers(names.dead_letter_stream("_models"))
        pipe.xlen(names.undecodable_stream)
        pipe.zcard(names.retry_schedule)
        registry, dlq_set, undecodable, retry_scheduled = await pipe.execute()
        models = {_text(m) for m in registry}
        candidates = sorted({*models, *(_text(m) for m in dlq_set)})
        pipe = store.pipeline(transaction=False)
        for model in candidates:
            pipe.xlen(names.dead_letter_stream(model))
        sizes = {m: int(n) for m, n in zip(candidates, await pipe.execute(), strict=True) if n}
        every = sorted({*models, *sizes, *(m for w in workers for m in w.models)})
        streams = await self._read_streams(every) if self._streams is not None else {}
        snap = summarize(self._broker.kind, names.prefix, models, workers, streams, sizes,
                         int(undecodable), int(retry_scheduled), now)
        return replace(snap, cluster=is_cluster_url(self._broker.url))

    async def _read_streams(self, models: Sequence[str]) -> dict[tuple[str, str], StreamStats]:
        """Every lane's shard streams (one round trip for the shard counts, one for them)."""
        assert self._streams is not None
        shards = await RedisModelRegistry(self._store, self._names).consumed_shards(models)
        streams = [(m, lane, s) for m in models for lane in LANES
                   for s in range(shards.get(m, 1))]
        pipe = self._streams.pipeline(transaction=False)
        for model, lane, shard in streams:
            stream = self._names.stream(model, lane, shard)
            pipe.xlen(stream)
            pipe.xrange(stream, count=1)
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies[0::3]:
            if isinstance(reply, Exception):
                raise reply
        group, now_ms = self._names.consumer_group.encode(), time.time() * 1000.0
        parts: dict[tuple[str, str], list[StreamStats]] = {}
        for i, (model, lane, _) in enumerate(streams):
            parts.setdefault((model, lane), []).append(_stream_stats(
                replies[3 * i], replies[3 * i + 1], replies[3 * i + 2], group, now_ms))
        return {lane: combine_shards(found) for lane, found in parts.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
