"""``batchfleet dlq``: inspect, replay and purge dead-lettered requests.

Replay re-runs a request under the same ID. Its ``failed`` result is turned
back into ``pending`` under a higher *generation* (a fencing token) and the
request is re-published stamped with it; the result store then refuses any
late write from the older generation, so the replayed run's result is the one
that sticks. Only ``failed`` requests are replayed: a request that succeeded or
expired meanwhile is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from connectors import BrokerURL, OutboundMessage, open_publisher, open_result_store
from connectors.dead_letters import DeadLetter, DeadLetterQueue
from schemas.envelopes import Result, decode_request, encode_request, encode_result
from schemas.names import Names


@dataclass(slots=True)
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class DeadLetterOps:
    def __init__(self, broker: str, results: str | None, namespace: str = "bf") -> None:
        from connectors.urls import results_url_for

        self._broker = BrokerURL.parse(broker)
        self._names = Names(namespace)
        self._store = open_result_store(results_url_for(self._broker, results), self._names)
        self.queue = DeadLetterQueue(self._store.redis, self._names)

    async def close(self) -> None:
        await self._store.close()

    async def letters(self, model: str | None = None, error_type: str | None = None,
                      request_ids: Sequence[str] = ()) -> list[DeadLetter]:
        models = [model] if model else await self.queue.models()
        found = [dl for m in models for dl in await self.queue.list(m)]
        if error_type:
            found = [dl for dl in found if dl.last_error_type == error_type]
        if request_ids:
            wanted = set(request_ids)
            found = [dl for dl in found if dl.request_id in wanted]
        return found

    async def replay(self, letters: Sequence[DeadLetter]) -> ReplayReport:
        report = ReplayReport()
        if not letters:
            return report
        requests = [decode_request(dl.envelope) for dl in letters]
        pending = [(r.request_id, encode_result(Result(r.request_id, "pending", model=r.model,
                                                       enqueued_at=r.enqueued_at)))
                   for r in requests]
        generations = await self._store.reopen_for_replay(pending)
        messages, done = [], []
        for dl, req, gen in zip(letters, requests, generations, strict=True):
            if gen < 0:
                report.skipped[dl.request_id] = "its result is no longer 'failed'"
                done.append(dl)
                continue
            fresh = replace(req, attempt=1, history=[], generation=gen)
            messages.append(OutboundMessage(req.model, req.lane, req.request_id,
                                            encode_request(fresh)))
            report.replayed.append(req.request_id)
            done.append(dl)
        publisher = open_publisher(self._broker, self._names)
        try:
            await publisher.publish(messages)
        finally:
            await publisher.close()
        await self.queue.remove(done)
        return report
