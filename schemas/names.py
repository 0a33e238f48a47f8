"""Every Redis key, stream, channel and Kafka topic name batchfleet uses, in one place.

Names are namespaced by a prefix (``bf`` by default) so several fleets can share
one Redis. Nothing else in the project builds a key by hand.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Final

from batchfleet.schemas.errors import ValidationError

# The name and ID checks live with the other validators; re-exported for existing callers.
from batchfleet.schemas.validation import check_model_name as check_model_name  # noqa: PLC0414
from batchfleet.schemas.validation import check_request_id as check_request_id  # noqa: PLC0414

LANE_INTERACTIVE: Final = "interactive"
LANE_BULK: Final = "bulk"
#: Lanes in the order a worker serves them: interactive traffic is never starved by bulk.
LANES: Final = (LANE_INTERACTIVE, LANE_BULK)
#: Most shard streams one lane may be split into (``--lane-shards``).
MAX_LANE_SHARDS: Final = 64


def shard_for(request_id: str, shards: int) -> int:
    """The shard of a lane a request goes to: CRC-32 (zlib, IEEE) of the request ID's
    UTF-8 bytes, mod ``shards``. Stable across processes and languages, so a raw-wire
    producer picks the same shard as the SDK (docs/wire-format.md); 0 when unsharded."""
    if shards <= 1:
        return 0
    return zlib.crc32(request_id.encode()) % shards


def check_lane(lane: str) -> str:
    if lane not in LANES:
        raise ValidationError(f"priority lane {lane!r} is not one of {', '.join(LANES)}")
    return lane


#: Redis Cluster: result records are spread over this many hash tags, so a batch's writes
#: fall into at most this many slot groups (one script call each).
RESULT_TAGS: Final = 16
#: The tags themselves, one per sixteenth of the 16,384 slots: tag ``i``'s CRC16 slot lies
#: in the middle half of slots ``[1024 i, 1024 (i + 1))`` (the first ``r<i>.<j>`` that
#: does; ``tests/unit/test_cluster_names.py`` re-derives them). ``{r0}``..``{r15}`` bunched
#: near four slots, so 3 primaries held 4, 8 and 4 of them; these split 5/6/5, and any
#: even split of the slots over up to 16 primaries gives each its share.
RESULT_TAG_TEXTS: Final = (
    "r0.63", "r1.68", "r2.43", "r3.48", "r4.13", "r5.18", "r6.9", "r7.38",
    "r8.43", "r9.8", "r10.13", "r11.18", "r12.21", "r13.39", "r14.3", "r15.4")


#: The prefix of every key, stream and topic unless --namespace says otherwise.
DEFAULT_NAMESPACE = "bf"


@dataclass(frozen=True, slots=True)
class Names:
    """Key and topic names under one namespace prefix.

    ``cluster=True`` (a ``redis+cluster://`` URL) adds Redis Cluster hash tags, so every
    Lua script touches one slot: the control plane (registry, retries, quotas, DLQ, …)
    shares the one tag ``{prefix}``; result records, lane streams and client channels get
    their own tags so they spread over the primaries (docs/cluster.md). Single-node names
    (the default) are unchanged byte for byte.
    """

    prefix: str = DEFAULT_NAMESPACE
    cluster: bool = False

    @property
    def plane(self) -> str:
        """Prefix of control-plane keys: ``{bf}`` on a cluster (one slot), else ``bf``."""
        return f"{{{self.prefix}}}" if self.cluster else self.prefix

    def for_cluster(self, cluster: bool = True) -> Names:
        """The same namespace with (or without) cluster hash tags."""
        return self if cluster == self.cluster else Names(self.prefix, cluster)

    @property
    def consumer_group(self) -> str:
        """One group per namespace, so two fleets on one Kafka cluster never rebalance together."""
        return f"{self.prefix}-workers"

    def stream(self, model: str, lane: str, shard: int = 0) -> str:
        """Redis stream holding one model's requests on one priority lane; a sharded lane
        (``--lane-shards``) is streams ``0..K-1``, shard 0 being the unsharded name (so
        K=1 is the same key) and shard ``s`` that name plus ``:{s}``."""
        if self.cluster:  # one tag per shard stream: shards spread over the primaries
            tail = f"{model}:{lane}" if shard == 0 else f"{model}:{lane}:{shard}"
            return f"{self.prefix}:stream:{{{tail}}}"
        base = f"{self.prefix}:stream:{model}:{lane}"
        return base if shard == 0 else f"{base}:{shard}"

    def shard_streams(self, model: str, lane: str, shards: int) -> list[str]:
        """Every shard stream of a lane split ``shards`` ways, shard 0 first."""
        return [self.stream(model, lane, s) for s in range(max(1, shards))]

    def topic(self, model: str, lane: str) -> str:
        """Kafka topic holding one model's requests on one priority lane (no ':' allowed);
        a version lane ``model@label`` becomes ``model.at.label`` (no '@' either)."""
        return f"{self.prefix}.requests.{model.replace('@', '.at.')}.{lane}"

    def result(self, request_id: str) -> str:
        """Hash holding a request's status and its encoded result envelope."""
        if self.cluster:
            tag = RESULT_TAG_TEXTS[result_tag(request_id)]
            return f"{self.prefix}:result:{{{tag}}}:{request_id}"
        return f"{self.prefix}:result:{request_id}"

    def notify_channel(self, client_id: str) -> str:
        """Pub/sub channel on which workers announce finished request IDs to one client."""
        if self.cluster:  # SPUBLISH goes to the channel's slot
            return f"{self.prefix}:notify:{{{client_id}}}"
        return f"{self.prefix}:notify:{client_id}"

    def dead_letter_stream(self, model: str) -> str:
        """Per-model dead-letter stream."""
        return f"{self.plane}:dlq:{model}"

    @property
    def model_registry(self) -> str:
        """Index set of every model with a registry record (declared or ever served): how
        submitters and the gateway tell an unknown model (refused at once) from one whose
        workers are scaled to zero or not started yet."""
        return f"{self.plane}:models"

    def model(self, name: str) -> str:
        """Hash holding one model's registry record (schemas/registry.py)."""
        return f"{self.plane}:model:{name}"

    def model_history(self, name: str) -> str:
        """Capped list (newest first) of one model's rollout policy changes."""
        return f"{self.plane}:model:{name}:history"

    @property
    def pipeline_registry(self) -> str:
        """Index set of every declared pipeline (schemas/pipeline.py); a pipeline's name
        is never also a model's: declaring either checks the other's key in one script."""
        return f"{self.plane}:pipelines"

    def pipeline_join(self, request_id: str, join: str) -> str:
        """Hash of one request's outputs waiting at a join: source step -> msgpack
        ``{outputs, done}``; expires with the result TTL."""
        return f"{self.plane}:join:{request_id}:{join}"

    def pipeline(self, name: str) -> str:
        """String holding one pipeline's record (msgpack, schemas/pipeline.py)."""
        return f"{self.plane}:pipeline:{name}"

    @property
    def lane_loss(self) -> str:
        """Hash ``{model}:{lane}`` -> epoch ms: a worker found that lane's stream or group
        gone (Redis restarted empty, flushed, the key evicted) and recreated it. Requests
        enqueued on it before that moment were lost; waiters read this to stop waiting."""
        return f"{self.plane}:lane-loss"

    @property
    def log_claims(self) -> str:
        """Hash ``{log}|hi`` / ``{log}|ts`` -> the highest offset of an ordered log (a Kafka
        partition, per consumer group) ever handed out, and the newest timestamp among
        those records: raised before they run, so the next owner can tell a redelivery
        from a first delivery (``workers.log_positions``)."""
        return f"{self.plane}:log-claims"

    @property
    def inflight_prefix(self) -> str:
        """Prefix of the per-owner in-flight sorted sets (request ID -> expiry); the owner's
        key ID completes the name. The result-writing script removes finished IDs."""
        return f"{self.plane}:inflight:"

    def quota_bucket(self, owner: str) -> str:
        """An API key's token bucket (hash: tokens, last refill)."""
        return f"{self.plane}:quota:{owner}"

    @property
    def cancelled(self) -> str:
        """Sorted set of request IDs cancelled while queued (ID -> cancel time): Redis
        Streams workers drop them unrun before compute; read only while it is non-empty."""
        return f"{self.plane}:cancelled"

    @property
    def retry_schedule(self) -> str:
        """Sorted set of requests waiting to be retried, scored by due time (epoch seconds)."""
        return f"{self.plane}:retry"

    @property
    def dead_letter_pattern(self) -> str:
        return f"{self.plane}:dlq:*"

    @property
    def undecodable_stream(self) -> str:
        """Messages too broken to yield a request ID or a model, kept with their raw bytes."""
        return f"{self.plane}:dlq:_undecodable"

    def worker_heartbeat(self, worker_id: str) -> str:
        """Key a live worker refreshes; its TTL makes dead workers disappear on their own."""
        return f"{self.plane}:worker:{worker_id}"

    @property
    def live_workers(self) -> str:
        """Sorted set: worker ID -> epoch seconds of its last beat, so readers find live
        workers in one ``ZRANGEBYSCORE`` instead of scanning for heartbeat keys."""
        return f"{self.plane}:workers"

    def bulk_job(self, job_id: str) -> str:
        """Hash: a bulk job's identity, status, checkpoint and counters."""
        return f"{self.plane}:bulk:job:{job_id}"

    def bulk_lease(self, job_id: str) -> str:
        """String with a TTL, held by the one process running a bulk job."""
        return f"{self.plane}:bulk:lease:{job_id}"

    def bulk_shards(self, job_id: str) -> str:
        """Sorted set of a job's shard record IDs (``JOB.shardK-of-N``) by start time: how
        ``bulk status JOB`` finds its shards without searching the job index."""
        return f"{self.plane}:bulk:shards:{job_id}"

    @property
    def bulk_jobs(self) -> str:
        """Sorted set of bulk job IDs by creation time, for ``bulk list``."""
        return f"{self.plane}:bulk:jobs"

    @property
    def webhook_queue(self) -> str:
        """RQ queue of webhook deliveries (RQ adds its own ``rq:queue:`` prefix)."""
        return f"{self.prefix}-webhooks"

    def webhook_job_id(self, request_id: str, generation: int) -> str:
        """RQ job ID of one request generation's webhook, also its ``Batchfleet-Delivery`` ID.

        RQ job IDs allow only ``[A-Za-z0-9_-]``, so the request ID is hashed. One job per
        (request, generation) is what makes enqueueing idempotent."""
        digest = hashlib.sha256(f"{self.prefix}\0{request_id}".encode()).hexdigest()[:32]
        return f"{re.sub(r'[^A-Za-z0-9_-]', '_', self.prefix)}-wh-{digest}-{generation}"


def result_tag(request_id: str) -> int:
    """Which of the :data:`RESULT_TAGS` cluster hash tags a result record carries: CRC-32
    of the ID mod 16, like :func:`shard_for`, so any language can compute it; the tag's
    text is ``RESULT_TAG_TEXTS[result_tag(id)]``."""
    return zlib.crc32(request_id.encode()) % RESULT_TAGS


def lane_loss_field(model: str, lane: str) -> str:
    """Field of :attr:`Names.lane_loss` for one lane."""
    return f"{model}:{lane}"
