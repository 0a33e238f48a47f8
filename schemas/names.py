"""Every Redis key, stream, channel and Kafka topic name batchfleet uses, in one place.

Names are namespaced by a prefix (``bf`` by default) so several fleets can share
one Redis. Nothing else in the project builds a key by hand.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from schemas.errors import ValidationError

LANE_INTERACTIVE: Final = "interactive"
LANE_BULK: Final = "bulk"
#: Lanes in the order a worker serves them: interactive traffic is never starved by bulk.
LANES: Final = (LANE_INTERACTIVE, LANE_BULK)


_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_GOOD_MODEL_NAMES: set[str] = set()
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def check_model_name(name: str) -> str:
    """Model names become stream and topic names, so they are kept to a safe alphabet."""
    if name in _GOOD_MODEL_NAMES:
        return name
    if not isinstance(name, str) or not _MODEL_NAME.match(name):
        raise ValidationError(
            f"model name {name!r} must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )
    if len(_GOOD_MODEL_NAMES) < 1024:
        _GOOD_MODEL_NAMES.add(name)
    return name


def check_request_id(request_id: str) -> str:
    """Request IDs travel in keys and in comma-joined notifications, so no commas or spaces."""
    if not _REQUEST_ID.match(request_id):
        raise ValidationError(
            f"request_id {request_id!r} must be 1-128 characters of letters, digits or ._:@-"
        )
    return request_id


def check_lane(lane: str) -> str:
    if lane not in LANES:
        raise ValidationError(f"priority lane {lane!r} is not one of {', '.join(LANES)}")
    return lane


@dataclass(frozen=True, slots=True)
class Names:
    """Key and topic names under one namespace prefix."""

    prefix: str = "bf"

    @property
    def consumer_group(self) -> str:
        """One group per namespace, so two fleets on one Kafka cluster never rebalance together."""
        return f"{self.prefix}-workers"

    def stream(self, model: str, lane: str) -> str:
        """Redis stream holding one model's requests on one priority lane."""
        return f"{self.prefix}:stream:{model}:{lane}"

    def topic(self, model: str, lane: str) -> str:
        """Kafka topic holding one model's requests on one priority lane (no ':' allowed)."""
        return f"{self.prefix}.requests.{model}.{lane}"

    def result(self, request_id: str) -> str:
        """Hash holding a request's status and its encoded result envelope."""
        return f"{self.prefix}:result:{request_id}"

    def notify_channel(self, client_id: str) -> str:
        """Pub/sub channel on which workers announce finished request IDs to one client."""
        return f"{self.prefix}:notify:{client_id}"

    def dead_letter_stream(self, model: str) -> str:
        """Per-model dead-letter stream."""
        return f"{self.prefix}:dlq:{model}"

    @property
    def model_registry(self) -> str:
        """Set of every model a worker has served: how submitters and the gateway tell an
        unknown model (refused at once) from one whose workers are scaled to zero."""
        return f"{self.prefix}:models"

    @property
    def retry_schedule(self) -> str:
        """Sorted set of requests waiting to be retried, scored by due time (epoch seconds)."""
        return f"{self.prefix}:retry"

    @property
    def dead_letter_pattern(self) -> str:
        return f"{self.prefix}:dlq:*"

    @property
    def undecodable_stream(self) -> str:
        """Messages too broken to yield a request ID or a model, kept with their raw bytes."""
        return f"{self.prefix}:dlq:_undecodable"

    def worker_heartbeat(self, worker_id: str) -> str:
        """Key a live worker refreshes; its TTL makes dead workers disappear on their own."""
        return f"{self.prefix}:worker:{worker_id}"

    def bulk_job(self, job_id: str) -> str:
        """Hash: a bulk job's identity, status, checkpoint and counters."""
        return f"{self.prefix}:bulk:job:{job_id}"

    def bulk_lease(self, job_id: str) -> str:
        """String with a TTL, held by the one process running a bulk job."""
        return f"{self.prefix}:bulk:lease:{job_id}"

    @property
    def bulk_jobs(self) -> str:
        """Sorted set of bulk job IDs by creation time, for ``bulk list``."""
        return f"{self.prefix}:bulk:jobs"

    @property
    def worker_heartbeat_pattern(self) -> str:
        return f"{self.prefix}:worker:*"

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
