"""One fixture, two transports: the same end-to-end tests run over Redis Streams and Kafka."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from batchfleet.connectors import BrokerURL, OutboundMessage
from batchfleet.processes import WorkerProcess
from batchfleet.producers import AsyncClient
from batchfleet.schemas.names import Names
from batchfleet.workers import Worker
from tests.support.fleet import running_worker
from tests.support.seams import open_publisher

#: Short Kafka sessions: Tansu holds a group join for half of it, and a dead member's
#: partitions move after it.
KAFKA_SESSION_MS = 6000


@dataclass(frozen=True, slots=True)
class Fleet:
    kind: str
    broker: str
    results: str
    namespace: str

    @property
    def names(self) -> Names:
        return Names(self.namespace)

    def client(self, **options: Any) -> AsyncClient:
        return AsyncClient(self.broker, self.results, namespace=self.namespace, **options)

    def _transport_options(self) -> dict[str, Any]:
        return {"kafka_session_timeout_ms": KAFKA_SESSION_MS} if self.kind == "kafka" else {}

    @asynccontextmanager
    async def worker(self, **overrides: Any) -> AsyncIterator[Worker]:
        async with running_worker(self.broker, self.results, namespace=self.namespace,
                                  **self._transport_options(), **overrides) as worker:
            yield worker

    def process(self, *extra_args: str, models: tuple[str, ...] = ("demo-mlp",)
                ) -> WorkerProcess:
        args = list(extra_args)
        if self.kind == "kafka":
            args += ["--kafka-session-timeout-ms", str(KAFKA_SESSION_MS)]
        return WorkerProcess(self.broker, self.results, models=models,
                             namespace=self.namespace, extra_args=tuple(args))

    async def raw_publish(self, model: str, payload: bytes, key: str = "raw") -> None:
        """Put bytes on a model's lane as a non-SDK producer would."""
        publisher = open_publisher(BrokerURL.parse(self.broker), self.names)
        try:
            await publisher.publish([OutboundMessage(model, "interactive", key, payload)])
        finally:
            await publisher.close()


def make_fleet(kind: str, redis_url: str, kafka_bootstrap: str | None) -> Fleet:
    # a fresh namespace per test: Kafka topics and groups outlive a test on the shared broker
    namespace = f"t{uuid.uuid4().hex[:10]}"
    if kind == "kafka":
        return Fleet(kind, f"kafka://{kafka_bootstrap}", redis_url, namespace)
    return Fleet(kind, redis_url, redis_url, namespace)
